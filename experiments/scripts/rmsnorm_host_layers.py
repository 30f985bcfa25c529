"""Where an exported RMSNorm package's forward call spends its host time, layer by layer (a diagnostic): per cell,
the median host time of a call (evo.host_times_us: perf_counter around each call, a synchronize every few calls
outside the timed ones) of

- api: the package's `rmsnorm_fwd(x, w)` (with `residual=` on a residual cell), what a model calls;
- api.into: the same call writing into given output tensors (`out=`, `residual_out=`: nothing allocated);
- api.routed: the same call with the direct launch left out (routing, the autograd Function, the runtime);
- runtime: the runtime's forward (no API routing, no autograd Function);
- launcher: the runtime's launcher on the call's choice, output allocated outside (binding and cuda.core's launch);
- cuda.core: cuda.core's `launch` alone with the arguments bound once;
- driver: cuda.bindings' cuLaunchKernel with the arguments packed once;
- ctypes: libcuda's cuLaunchKernel through ctypes with the arguments packed once (the floor of a Python launch);
- empty_like: torch.empty_like(x) alone (an output's allocation);
- torch.eager: torch.nn.functional.rms_norm (and the float32 residual add on a residual cell);

and a cProfile of the api call, its functions by own time per call.

With `--bench-samples K`, every layer is also timed by the package bench's own timer (`<package>.timing`, K samples
each, the layers taking turns, the L2 flushed before each sample): kernel time (the stream held busy while the host
issues the call), call time (the GPU idle when the call starts: what a Python caller waits), host time with the
stream held, and, from the same idle-GPU samples, the host time around the call and the latency left after it
(call time minus that host time: from the call's return to the end of its GPU work). Layers added for these:
direct.raw and direct.cuda_core (the signature's direct launch alone, by libcuda's cuLaunchKernel and by cuda.core's
launch, output given) and torch.mul (one torch kernel into a given output: torch's own launch path).

    python experiments/scripts/rmsnorm_host_layers.py OUT.json [--package kf_rmsnorm] [--calls 2000] [--top 25]
        [--bench-samples 200]

Needs the installed package, torch, cuda-python and a CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from evo import host_times_us, profile_rows

CELLS = (("bfloat16", 1, 4096, False), ("bfloat16", 140, 4096, False), ("bfloat16", 4096, 1024, False),
         ("bfloat16", 140, 4096, True))


def _sides(pkg: Any, torch: Any, dt: str, m: int, n: int, residual: bool) -> dict[str, Any]:
    """The layers' zero-argument callables on one cell's tensors."""
    run = importlib.import_module(f"{pkg.__name__}.run")
    launch_mod = importlib.import_module(f"{pkg.__name__}.launch")
    dtype = getattr(torch, dt)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, generator=g, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g, device="cuda")).to(dtype)
    res = torch.randn(m, n, generator=g, device="cuda").to(dtype) if residual else None
    eps = 1e-6
    rt = run.runtime()
    sides: dict[str, Any] = {}
    if residual:
        sides["api"] = lambda: pkg.rmsnorm_fwd(x, w, residual=res, eps=eps)
        sides["runtime"] = lambda: rt.forward_variant(x, w, res, None, eps, False)
        c = rt.variant_choice(x, w, res, None, False)
        out, res_out = torch.empty_like(x), torch.empty_like(res)
        tensors = run.variant_tensors(x, w, out, res, res_out, None, None)

        def eager():
            h = x.float() + res.float()
            return torch.nn.functional.rms_norm(h, (n,), w.float(), eps).to(dtype), h.to(dtype)
    else:
        sides["api"] = lambda: pkg.rmsnorm_fwd(x, w, eps=eps)
        sides["runtime"] = lambda: rt.forward(x, w, eps)
        c = rt.choice("rmsnorm", x, w)
        out = torch.empty_like(x)
        tensors = {"x": x, "w": w, "y": out}

        def eager():
            return torch.nn.functional.rms_norm(x, (n,), w, eps)
    sides["api"]()  # the first-use check, the module loaded, the direct launch learned
    api = importlib.import_module(f"{pkg.__name__}.api")
    direct = api._fast

    def routed(fn: Any) -> Any:
        def call():
            api._fast = lambda *a: None
            try:
                return fn()
            finally:
                api._fast = direct
        return call
    y_into = torch.empty_like(x)
    r_into = torch.empty_like(res) if residual else None

    def into():
        return pkg.rmsnorm_fwd(x, w, residual=res, eps=eps, out=y_into, residual_out=r_into)
    sides = {"api": sides["api"], "api.into": into, "api.routed": routed(sides["api"]),
             **{k: v for k, v in sides.items() if k != "api"}}
    if not c.kernel:
        raise RuntimeError(f"{dt} M{m}-N{n}: the package takes torch here ({c.reason})")
    launcher = rt.launcher
    sides["launcher"] = lambda: launcher.run(c, tensors, {"eps": eps})
    ready = launcher.prepared(c, 0)
    if ready.workspaces or len(ready.launches) != 1:
        raise RuntimeError(f"{c.template}: a plan of {len(ready.launches)} launches with workspaces: no single-launch "
                           "floor")
    ln, kernel, config, plan = ready.launches[0]
    args = plan.bind({k: t.data_ptr() for k, t in tensors.items()}, {"eps": eps})
    from cuda.core import launch

    stream = launcher._stream(0, launch_mod.current_stream_handle(0))
    sides["cuda.core"] = lambda: launch(stream, config, kernel, *args)
    sides["driver"] = _driver_side(kernel, ln, args, stream)
    sides["ctypes"] = _ctypes_side(kernel, ln, args, launch_mod.current_stream_handle(0))
    sides["empty_like"] = lambda: torch.empty_like(x)
    sides["torch.eager"] = eager
    sides["torch.mul"] = lambda: torch.mul(x, w, out=y_into)
    key = api._signature(x, w, res)
    d = rt.fast.get(key)
    if d:
        names = api._PLAIN_TENSORS if res is None else api._RESIDUAL_TENSORS
        ptrs = (x.data_ptr(), w.data_ptr(), y_into.data_ptr()) + (() if res is None else
                                                                  (res.data_ptr(), r_into.data_ptr()))
        slow = rt.direct(c, "rmsnorm", x.device, names, api._SCALARS)
        slow.use_cuda_core()
        sides["direct.raw" if d.raw else "direct"] = lambda: d(*ptrs, eps)
        sides["direct.cuda_core"] = lambda: slow(*ptrs, eps)
    return sides


def bench_timer(pkg: Any, torch: Any, sides: dict[str, Any], samples: int) -> dict[str, dict[str, float]]:
    """Per layer, medians in us of the package bench's kernel, call and held-stream host times, and of the host time
    and the latency after it in idle-GPU samples taken the same way (the bench's own sample, the layers taking turns,
    the L2 flushed)."""
    timing = importlib.import_module(f"{pkg.__name__}.timing")
    names = list(sides)
    fns = [sides[k] for k in names]
    kernel, call, host = timing.kernel_and_call_us(fns, samples)
    flush = torch.ones(timing._FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    idle: list[list[tuple[float, float]]] = [[] for _ in fns]  # (call, host) of each idle-GPU sample
    for i in range(samples):
        for j in [(i + r) % len(fns) for r in range(len(fns))]:
            idle[j].append(timing._once(fns[j], flush, hold=False))
    med = statistics.median
    return {k: {"kernel_us": med(kernel[j]), "call_us": med(call[j]), "host_held_us": med(host[j]),
                "host_idle_us": med(h for _, h in idle[j]), "call_idle_us": med(c for c, _ in idle[j]),
                "after_host_us": med(c - h for c, h in idle[j])}
            for j, k in enumerate(names)}


def _packed(args: list[Any]) -> tuple[list[Any], Any]:
    """Each argument as a ctypes value (a Python int: a pointer-sized value) and the void* array of their addresses."""
    import numpy as np

    vals: list[Any] = []
    for a in args:
        if isinstance(a, int):
            vals.append(ctypes.c_uint64(a))
        elif isinstance(a, np.floating):
            vals.append(ctypes.c_float(float(a)) if a.dtype == np.float32 else ctypes.c_double(float(a)))
        elif a.dtype == np.int32:
            vals.append(ctypes.c_int32(int(a)))
        else:
            vals.append(ctypes.c_uint64(int(a)))
    arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    return vals, arr


def _driver_side(kernel: Any, ln: Any, args: list[Any], stream: Any) -> Any:
    from cuda.bindings import driver

    vals, arr = _packed(args)
    fn = driver.CUfunction(int(kernel.handle))
    h = driver.CUstream(int(stream.handle))
    (gx, gy, gz), (bx, by, bz) = ln.grid, ln.block

    def call():
        (err,) = driver.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, ln.smem, h, ctypes.addressof(arr), 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel: {err}")
    call.keep = (vals, arr)  # type: ignore[attr-defined]
    return call


def _ctypes_side(kernel: Any, ln: Any, args: list[Any], stream: int) -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuLaunchKernel
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    vals, arr = _packed(args)
    k = int(kernel.handle)
    (gx, gy, gz), (bx, by, bz) = ln.grid, ln.block

    def call():
        err = f(k, gx, gy, gz, bx, by, bz, ln.smem, stream, arr, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel: CUresult {err}")
    call.keep = (vals, arr)  # type: ignore[attr-defined]
    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--package", default="kf_rmsnorm")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--bench-samples", type=int, default=0,
                    help="also time every layer with the package bench's timer, this many samples each (0: off)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("rmsnorm_host_layers: no CUDA device", file=sys.stderr)
        return 2
    pkg = importlib.import_module(args.package)
    sync = torch.cuda.synchronize
    cells = []
    for dt, m, n, residual in CELLS:
        label = f"{dt} M{m}-N{n}{' residual' if residual else ''}"
        try:
            sides = _sides(pkg, torch, dt, m, n, residual)
        except RuntimeError as e:
            print(f"{label}: {e}", flush=True)
            cells.append({"cell": label, "error": str(e)})
            continue
        row: dict[str, Any] = {"cell": label, "host_us_median": {}}
        for name, fn in sides.items():
            row["host_us_median"][name] = statistics.median(host_times_us(fn, args.calls, sync))
        row["api_profile"] = profile_rows(sides["api"], args.calls, sync, args.top)
        cells.append(row)
        print(label + ": " + ", ".join(f"{k} {v:.1f}" for k, v in row["host_us_median"].items()) + " us", flush=True)
        if args.bench_samples:
            row["bench_timer"] = bench_timer(pkg, torch, sides, args.bench_samples)
            for k, v in row["bench_timer"].items():
                print(f"  {k}: " + ", ".join(f"{f} {u:.1f}" for f, u in v.items()), flush=True)
    try:
        import cuda.core as cc
        cuda_core = getattr(cc, "__version__", "?")
    except ImportError:
        cuda_core = None
    env = importlib.import_module(f"{args.package}.environment")
    doc = {"kind": "diagnostic", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda_core": cuda_core, "python": platform.python_version(), "package": args.package,
           "environment": env.environment(("cuda-core", "cuda-bindings")),
           "package_stats": pkg.stats(), "calls": args.calls, "bench_samples": args.bench_samples, "method": __doc__.split("\n\n")[0], "cells": cells}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

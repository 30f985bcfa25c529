"""An exported RMSNorm package in a training step: y = rmsnorm(x, w), then dx and dw from dy by autograd, per
searched plain forward cell, beside torch eager's rms_norm and the peers that are installed (Liger's autograd
function, QuACK's rmsnorm, torch.compile with --compile), in one process on the same inputs with the package's
timer (CUDA events around each step, the L2 flushed by a 256 MiB read before each, sides interleaved in both
orders, median). The package's backward recomputes rstd from x (its searched forward kernels do not store it):
the same step with the package's former rstd (x copied to float32, squared, averaged: `rstd_3pass`) is timed
beside, and each rstd alone, so the one change is measured in the same process.

    python experiments/scripts/rmsnorm_train_step.py OUT.json [--package kf_rmsnorm] [--samples 30]
        [--cells REGEX] [--compile] [--split] [--host-parts CALLS] [--time-limit 300]
    python experiments/scripts/rmsnorm_train_step.py --table TRAIN.json   (a markdown table, no GPU)

Every side's dx and dw are checked against float64 (the package's own verify.check_backward) before timing; a
side that is wrong is reported and not timed; a peer not installed is reported absent. --split also times the
package's and torch eager's step with the stream held busy while the host issues it (their GPU share) and the
host's own time per step (perf_counter). --host-parts N times N calls of each part of the package's step on the
host alone (evo/tools/host_profile.py: perf_counter, a synchronize every 20 calls outside the timed ones): the
step, its forward with and without autograd, the runtime's forward and backward called directly, the rstd, the
choice, the forward kernel's launch, torch's empty_like; torch eager's step and forward beside; and a cProfile of the forward
and of the runtime's backward (the step's backward runs on autograd's device thread, which cProfile does not see).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evo import host_times_us, profile_rows

EPS = 1e-6
PROFILE_TOP = 15


def rstd_3pass(x: Any, eps: float) -> Any:
    """The package's rstd before 2026-12-06: x copied to float32, squared, averaged (three passes of M x N floats)."""
    import torch

    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return torch.rsqrt(xf.square().mean(dim=-1) + eps)


def peers(n: int, compile_: bool) -> tuple[dict[str, Callable[[Any, Any], Any]], dict[str, str]]:
    """(name -> f(x, w) -> y with autograd, name -> why absent) for the peers of a row length n."""
    import torch

    have: dict[str, Callable[[Any, Any], Any]] = {
        "torch.eager": lambda x, w: torch.nn.functional.rms_norm(x, (n,), w, EPS)}
    absent: dict[str, str] = {}
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        have["liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    except ImportError as e:
        absent["liger"] = f"not installed ({e})"
    try:
        quack = importlib.import_module("quack")
        have["quack"] = lambda x, w: quack.rmsnorm(x, w, eps=EPS)
    except (ImportError, AttributeError) as e:
        absent["quack"] = f"not installed ({e})"
    if compile_:
        f = torch.compile(lambda x, w: torch.nn.functional.rms_norm(x, (n,), w, EPS), dynamic=False)
        have["torch.compile"] = f
    return have, absent


def fingerprint() -> dict[str, Any]:
    import torch

    q = "name,clocks.sm,clocks.max.sm,clocks.mem,driver_version"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=False).stdout.strip()
    except OSError as e:
        smi = f"nvidia-smi failed: {e}"
    versions = {}
    for mod in ("liger_kernel", "quack", "triton"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod.replace("_", "-") if mod != "quack" else "quack-kernels")
        except Exception as e:  # noqa: BLE001  (absent or unversioned: say so)
            versions[mod] = f"absent ({type(e).__name__})"
    return {"gpu": torch.cuda.get_device_name(), "nvidia_smi": dict(zip(q.split(","), smi.split(", "))),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(), **versions}


def host_parts(pkg: Any, x: Any, w: Any, dy: Any, step: Callable[[], Any], eager_step: Callable[[], Any] | None,
               calls: int) -> dict[str, Any]:
    """The median host µs of each part of the package's step (the module docstring's --host-parts) and cProfiles of
    the forward and of the runtime's backward, on the cell's inputs."""
    import torch

    api = importlib.import_module(f"{pkg.__name__}.api")
    reference = importlib.import_module(f"{pkg.__name__}.reference")
    rt = importlib.import_module(f"{pkg.__name__}.run").runtime()
    n = x.shape[-1]
    x2, w2 = x.detach(), w.detach()
    with torch.no_grad():
        r = reference.rstd(x2, EPS)
    y = torch.empty_like(x2)
    c = rt.choice("rmsnorm", x2, w2)

    def no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return fn()
        return run

    parts: dict[str, Callable[[], Any]] = {
        "step": step, "forward": lambda: api.rmsnorm(x, w, eps=EPS),
        "forward.no_grad": no_grad(lambda: api.rmsnorm(x2, w2, eps=EPS)),
        "runtime.forward": lambda: rt.forward(x2, w2, EPS), "runtime.backward": lambda: rt.backward(x2, w2, dy, r),
        "rstd": no_grad(lambda: reference.rstd(x2, EPS)), "choice": lambda: rt.choice("rmsnorm", x2, w2),
        "empty_like": lambda: torch.empty_like(x2)}
    if c.kernel:
        parts["launch"] = lambda: rt.launcher.run(c, {"x": x2, "w": w2, "y": y}, {"eps": EPS})
    if eager_step is not None:
        parts["eager.step"] = eager_step
        parts["eager.forward"] = lambda: torch.nn.functional.rms_norm(x, (n,), w, EPS)
    sync = torch.cuda.synchronize
    out = {name: statistics.median(host_times_us(fn, calls, sync)) for name, fn in parts.items()}
    prof = {name: profile_rows(parts[name], calls, sync, PROFILE_TOP) for name in ("forward", "runtime.backward")}
    return {"host_parts_us": out, "host_profile": prof}


def cell_row(pkg: Any, entry: Any, samples: int, compile_: bool, split: bool, parts: int = 0) -> dict[str, Any]:
    import torch

    api = importlib.import_module(f"{pkg.__name__}.api")
    reference = importlib.import_module(f"{pkg.__name__}.reference")
    verify = importlib.import_module(f"{pkg.__name__}.verify")
    timing = importlib.import_module(f"{pkg.__name__}.timing")
    dt, dims = dict(entry.dtypes), dict(entry.dims)
    m, n = dims["M"], dims["N"]
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(getattr(torch, dt["x"])).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(getattr(torch, dt["w"])).requires_grad_(True)
    dy = torch.randn(m, n, device="cuda", generator=g).to(x.dtype)
    new_rstd = reference.rstd

    def step(forward: Callable[[Any, Any], Any], rstd: Callable[[Any, float], Any] = new_rstd) -> Callable[[], Any]:
        def run() -> Any:
            reference.rstd = rstd
            try:
                return torch.autograd.grad(forward(x, w), (x, w), dy)
            finally:
                reference.rstd = new_rstd
        return run

    ours = lambda x_, w_: api.rmsnorm(x_, w_, eps=EPS)  # noqa: E731
    have, absent = peers(n, compile_)
    sides = {"ours": step(ours), "ours.rstd_3pass": step(ours, rstd_3pass)}
    sides.update({name: step(f) for name, f in have.items()})
    with torch.no_grad():
        r = torch.rsqrt(x.float().square().mean(-1) + EPS)
    wrong = {}
    for name, fn in list(sides.items()):
        try:
            dx, dw = fn()
            problem = verify.check_backward(x.detach(), w.detach(), dy, r, dx, dw)
        except Exception as e:  # noqa: BLE001  (a peer that fails on this cell is reported, not timed)
            problem = f"{type(e).__name__}: {str(e)[:300]}"
        if problem:
            wrong[name] = problem
            del sides[name]
    names = list(sides)
    times = timing.samples_us([sides[k] for k in names], samples)
    med = {k: statistics.median(t) for k, t in zip(names, times)}
    with torch.no_grad():
        xd = x.detach()
        rstd_t = timing.samples_us([lambda: new_rstd(xd, EPS), lambda: rstd_3pass(xd, EPS)], samples)
    row: dict[str, Any] = {
        "cell": entry.cell, "M": m, "N": n, "dtypes": dt, "samples": samples,
        "paths": {"rmsnorm": pkg.explain((m, n), dt["x"], dt["w"], store_rstd=True).path,  # the step's forward
                  "rmsnorm_bwd": pkg.explain((m, n), dt["x"], dt["w"], op="rmsnorm_bwd").path},
        "median_us": med, "p10_p90_us": {k: _spread(t) for k, t in zip(names, times)},
        "ours_speedup": {k: med[k] / med["ours"] for k in names if k != "ours" and "ours" in med},
        "rstd_us": {"one_reduction": statistics.median(rstd_t[0]), "rstd_3pass": statistics.median(rstd_t[1])},
        "wrong": wrong, "absent": absent}
    if split and "ours" in sides:
        pair = ["ours", "torch.eager"]
        gpu, host = timing.split_us([sides[k] for k in pair], samples)
        row["gpu_share_us"] = {k: statistics.median(t) for k, t in zip(pair, gpu)}
        row["host_us"] = {k: statistics.median(t) for k, t in zip(pair, host)}
    if parts and "ours" in sides:
        row.update(host_parts(pkg, x, w, dy, sides["ours"], sides.get("torch.eager"), parts))
    return row


def _spread(v: list[float]) -> list[float]:
    q = statistics.quantiles(v, n=10)
    return [q[0], q[-1]]


def markdown(doc: dict[str, Any]) -> str:
    """A markdown table of a train.json: per cell the package's step, each side's median and the package's speedup
    over it (side / package), the two rstd's alone, and the host share where --split ran."""
    sides = sorted({k for c in doc["cells"] for k in c["median_us"]} - {"ours"})
    head = ["cell", "paths", "ours µs", *(f"{k} µs (x)" for k in sides), "rstd 1 red. / 3-pass µs", "host µs ours / eager"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for c in doc["cells"]:
        med, sp = c["median_us"], c["ours_speedup"]
        cells = [c["cell"].split(" ")[-1] + " " + "/".join(c["dtypes"][k] for k in ("x", "w")),
                 "+".join(c["paths"].values()), f"{med['ours']:.1f}" if "ours" in med else "wrong"]
        cells += [f"{med[k]:.1f} ({sp[k]:.3f}x)" if k in sp else ("wrong" if k in c["wrong"] else "absent")
                  for k in sides]
        cells.append(f"{c['rstd_us']['one_reduction']:.1f} / {c['rstd_us']['rstd_3pass']:.1f}")
        h = c.get("host_us", {})
        cells.append(f"{h['ours']:.1f} / {h['torch.eager']:.1f}" if h else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n" + parts_markdown(doc)


def parts_markdown(doc: dict[str, Any]) -> str:
    """Where --host-parts ran: a table of each cell's host µs per part of the step ('' where it did not run)."""
    cells = [c for c in doc["cells"] if "host_parts_us" in c]
    if not cells:
        return ""
    names = list(dict.fromkeys(k for c in cells for k in c["host_parts_us"]))
    rows = ["", "Host µs a call, per part (median):", "", "| cell | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names)]
    for c in cells:
        h = c["host_parts_us"]
        rows.append(f"| {c['cell'].split(' ')[-1]} {c['dtypes']['x']} | "
                    + " | ".join(f"{h[k]:.1f}" if k in h else "" for k in names) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        if len(argv) != 2:
            print("usage: rmsnorm_train_step.py --table TRAIN.json", file=sys.stderr)
            return 2
        print(markdown(json.loads(Path(argv[1]).read_text())), end="")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--package", default="kf_rmsnorm")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--cells", default="", help="a regular expression the cell names must match (default: all)")
    ap.add_argument("--compile", action="store_true", help="torch.compile of rms_norm as a peer (compiles per cell)")
    ap.add_argument("--split", action="store_true")
    ap.add_argument("--host-parts", type=int, default=0, metavar="CALLS",
                    help="host µs of each part of the package's step over CALLS calls, and cProfiles (0: off)")
    ap.add_argument("--time-limit", type=float, default=300.0, help="no new cell after this many seconds")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("rmsnorm_train_step: no CUDA device", file=sys.stderr)
        return 2
    pkg = importlib.import_module(args.package)
    table = importlib.import_module(f"{args.package}.table").tables().get("rmsnorm")
    if table is None:
        print(f"rmsnorm_train_step: {args.package} exports no rmsnorm run", file=sys.stderr)
        return 2
    pat = re.compile(args.cells)
    entries = [e for e in table.entries if pat.search(e.cell) and len(e.dtypes) == 2 and set(dict(e.dims)) == {"M", "N"}]
    t0 = time.monotonic()
    rows, skipped = [], []
    for e in entries:
        if time.monotonic() - t0 > args.time_limit:
            skipped.append(e.cell)
            continue
        rows.append(cell_row(pkg, e, args.samples, args.compile, args.split, args.host_parts))
        sp = rows[-1]["ours_speedup"]
        print(f"{e.cell}: ours {rows[-1]['median_us'].get('ours', float('nan')):.1f} us; "
              + ", ".join(f"{k} {v:.3f}x" for k, v in sp.items()), flush=True)
        torch.cuda.empty_cache()
    doc = {"method": __doc__.split("\n\n")[0], "fingerprint": fingerprint(), "package": args.package,
           "package_stats": pkg.stats() if hasattr(pkg, "stats") else None, "cells": rows, "cells_skipped": skipped}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    bad = {r["cell"]: r["wrong"] for r in rows if "ours" in r["wrong"] or "ours.rstd_3pass" in r["wrong"]}
    if bad:
        print(f"rmsnorm_train_step: the package was wrong: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

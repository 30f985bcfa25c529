"""fla (when installed) against the exported kernels on every searched cell, in one process, on the same
inputs.

Each launch is timed with CUDA events after a 256 MiB read that flushes the L2 (clean lines only); the
sides take turns (both orders), and the median of all samples is kept. Outputs are checked against a float64 reference
(first and last sequence) before timing. A decode cell is timed against fla's fused_recurrent_kda, a
prefill one against chunk_kda; without fla only the exported kernels are timed.

With --split each side is also timed with the stream held busy while the host issues the call (its GPU time,
`*_gpu_us`) and its host time per call is measured (`*_host_us`): a call's events time is about the larger of the
two plus the rest. A call that synchronizes inside (reads a device value on the host) defeats the hold.

    python -m <package>.bench [--out bench.json] [--samples 100] [--quick] [--split]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from . import api, benchmark, verify
from .benchmark import geomean
from .choose import ENTRY_POINTS, kind_of
from .table import Entry, tables
from .timing import samples_us, split_us

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def inputs(dims: dict[str, int], dtypes: dict[str, str], seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors and fla keywords for a cell: unit q, k rows (or rows of norm 0.1..10 under the in-kernel
    norm), log decays exp(-exp(N(-2, 1))), an initial state ~K^-1/2, cu_seqlens of uneven lengths when
    N != B, A_log and dt_bias for a gate computed in the kernel."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, t, h, hv, k, v, n = (dims[d] for d in ("B", "T", "H", "HV", "K", "V", "N"))
    x, gdt = _TORCH[dtypes["x"]], _TORCH[dtypes["g"]]

    def rows(shape: tuple[int, ...]) -> torch.Tensor:
        r = torch.nn.functional.normalize(torch.randn(shape, device="cuda", generator=gen), dim=-1)
        if dims["qk_l2norm"]:
            r = r * 10.0 ** (2 * torch.rand((*shape[:-1], 1), device="cuda", generator=gen) - 1)
        return r.to(x)

    q, kk = rows((b, t, h, k)), rows((b, t, h, k))
    vv = torch.randn(b, t, hv, v, device="cuda", generator=gen).to(x)
    decay = -torch.exp(torch.randn(b, t, hv, k, device="cuda", generator=gen) - 2.0)
    logits = torch.randn(b, t, hv, device="cuda", generator=gen)
    beta = (logits if dims["beta_act"] else torch.sigmoid(logits)).to(x)
    shape = (n, hv, dims["SR"], dims["SC"])
    h0 = torch.randn(shape, device="cuda", generator=gen) / math.sqrt(k)
    kw: dict[str, Any] = {"initial_state": h0, "output_final_state": True,
                          "use_qk_l2norm_in_kernel": bool(dims["qk_l2norm"]),
                          "use_beta_sigmoid_in_kernel": dims["beta_act"] != 0,
                          "allow_neg_eigval": dims["beta_act"] == 2, "state_v_first": bool(dims["v_first"])}
    g = decay
    if dims["gate"]:
        kw |= {"use_gate_in_kernel": True, "A_log": torch.zeros(hv, device="cuda"),
               "dt_bias": torch.zeros(hv * k, device="cuda")}
        if dims["gate"] == 2:
            kw["lower_bound"] = -5.0
            g = torch.logit((decay / -5.0).clamp(1e-6, 1 - 1e-4))
        else:
            g = torch.log(torch.expm1(-decay))  # softplus^-1 of -decay, with A_log = 0
    if n != b:
        cuts = torch.randperm(t - 1, generator=torch.Generator().manual_seed(seed))[: n - 1] + 1
        kw["cu_seqlens"] = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([t])]).to("cuda")
    return {"q": q, "k": kk, "v": vv, "g": g.to(gdt), "beta": beta}, kw


def fla_entry(entry: str) -> Callable | None:
    try:
        import fla.ops.kda as fla_kda
    except ImportError:
        return None
    return getattr(fla_kda, entry, None)


def check(dims: dict[str, int], t: dict[str, Any], kw: dict[str, Any], o: torch.Tensor, final: torch.Tensor) -> str:
    s = {"scale": dims["K"] ** -0.5, "lower_bound": kw.get("lower_bound") or -5.0,
         **{d: dims[d] for d in ("gate", "beta_act", "qk_l2norm", "v_first")}}
    bound = {**t, **{n: kw.get(n) for n in ("initial_state", "cu_seqlens", "A_log", "dt_bias")}}
    return verify.check(bound, s, o, final)


def cell_row(e: Entry, samples: int, split: bool = False) -> dict:
    dims, dt = dict(e.dims), dict(e.dtypes)
    entry = next(ep for ep, (kind, _) in ENTRY_POINTS.items() if kind == kind_of(e.template))
    t, kw = inputs(dims, dt)
    ours = getattr(api, entry)
    o, final = ours(**t, **kw)
    problem = check(dims, t, kw, o, final)
    fns = [lambda: ours(**t, **kw)]
    peer = fla_entry(entry)
    if peer is not None:
        fkw = dict(kw)
        if entry == "chunk_kda":
            fkw["safe_gate"] = dims["gate"] == 2
        fns.append(lambda: peer(**t, **fkw))
    times = samples_us(fns, samples)
    ours_us = statistics.median(times[0])
    fla_us = statistics.median(times[1]) if peer is not None else None
    row = {"cell": e.cell, "entry": entry, "dims": dims, "dtypes": dt, "exported_us": ours_us, "fla_us": fla_us,
           "speedup_vs_fla": fla_us / ours_us if fla_us else None, "searched_median_us": e.median_us,
           "searched_baseline": e.baseline, "searched_baseline_us": e.baseline_us, "samples": samples,
           "correct": not problem, "error": problem}
    if split:  # the GPU's and the host's shares of each side's call (timing.split_us)
        gpu, host = split_us(fns, samples)
        for side, i in (("exported", 0), ("fla", 1)):
            row[f"{side}_gpu_us"] = statistics.median(gpu[i]) if i < len(fns) else None
            row[f"{side}_host_us"] = statistics.median(host[i]) if i < len(fns) else None
    return row


def measure(args: argparse.Namespace) -> benchmark.Measured:
    """Every searched cell's row (with --quick the first and last) and the geomean speedup over fla."""
    entries = list(tables()["kda"].entries) if "kda" in tables() else []
    if args.quick:
        entries = entries[:1] + entries[-1:] if len(entries) > 1 else entries
    rows = [cell_row(e, args.samples, getattr(args, "split", False)) for e in entries]
    gm = geomean(r["speedup_vs_fla"] for r in rows if r["speedup_vs_fla"])
    return rows, {"geomean_speedup_vs_fla": gm}, f"geomean speedup over fla: {gm}"


def main(argv: list[str] | None = None) -> int:
    return benchmark.main(argv, __doc__.split("\n\n")[0], "the first and last cell only", measure,
                          lambda: {"fla": _fla_version()}, split=True)


def _fla_version() -> str | None:
    """fla's version from whichever distribution installed it (fla-core holds the kernels; the full
    flash-linear-attention depends on it)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())

"""The first-use check of a kernel the factory's gate never ran (re-rendered, repaired, or compiled for
another arch): o and the final state on the call's own data against a float64 torch reference, once
per kernel; also the acceptance the package's GPU tests apply.

Sequences checked: the first and the last (where an indexing bug shows), or all of a varlen batch.
Tolerances are the factory's (ops/kda/spec.py): elementwise |a - b| <= atol + rtol |b|, and the
RMS-relative error ||a - b|| / ||b|| <= rel_norm; o by the x dtype, the final state by the coarser of
x and the state dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from . import reference

# dtype -> (atol, rtol, rel_norm), as ops/kda/spec.py in the factory
O_TOLERANCE = {torch.float32: (1e-4, 1e-3, 2e-5), torch.float16: (2e-3, 1e-2, 1.5e-3),
               torch.bfloat16: (2e-2, 5e-2, 5e-3)}
STATE_TOLERANCE = {torch.float32: (4e-4, 1e-3, 2e-5), torch.float16: (6e-3, 1e-2, 1.5e-3),
                   torch.bfloat16: (6e-2, 5e-2, 5e-3)}
_PRECISION = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def state_tolerance(x: torch.dtype, state: torch.dtype) -> tuple[float, float, float]:
    return STATE_TOLERANCE[max(x, state, key=lambda d: _PRECISION.get(d, 0))]


def compare(name: str, got: Tensor, ref: Tensor, tol: tuple[float, float, float]) -> str:
    """'' when `got` is finite and within tolerance of the float64 `ref`, else what is wrong."""
    atol, rtol, rel_norm = tol
    got, ref = got.double(), ref.double()
    if not bool(torch.isfinite(got).all()):
        return f"{name}: {int((~torch.isfinite(got)).sum())} of {got.numel()} elements are not finite"
    err = (got - ref).abs()
    bad = int((err > atol + rtol * ref.abs()).sum())
    if bad:
        return f"{name}: {bad} of {got.numel()} elements off the float64 reference (max |err| {float(err.max()):.3g})"
    denom = float(ref.norm())
    rel = float((got - ref).norm()) / denom if denom > 0 else float(err.max())
    if rel > rel_norm:
        return f"{name}: RMS-relative error {rel:.3g} > {rel_norm:g}"
    return ""


def seqs(n: int, varlen: bool) -> list[int]:
    return list(range(n)) if varlen else sorted({0, n - 1})


def check(t: Mapping[str, Tensor | None], s: Mapping[str, Any], o: Tensor, final: Tensor) -> str:
    """o and final (the kernel's) against float64 on the checked sequences of the call (tensors `t`,
    scalars `s` as the launch got them)."""
    cu = t.get("cu_seqlens")
    varlen = cu is not None
    n = final.shape[0]
    idx = seqs(n, varlen)
    pick = (lambda x: x) if varlen else (lambda x: None if x is None else x[idx])
    h0 = t.get("initial_state")
    ref_o, ref_s = reference.kda(
        pick(t["q"]), pick(t["k"]), pick(t["v"]), pick(t["g"]), pick(t["beta"]), A_log=t.get("A_log"),
        dt_bias=t.get("dt_bias"), scale=float(s["scale"]), initial_state=None if h0 is None else h0[idx] if not varlen
        else h0, cu_seqlens=cu, gate=int(s["gate"]), beta_act=int(s["beta_act"]), qk_l2norm=bool(s["qk_l2norm"]),
        v_first=bool(s["v_first"]), lower_bound=float(s["lower_bound"]), acc=torch.float64)
    x = t["v"].dtype
    problem = compare("o", pick(o), ref_o, O_TOLERANCE[x])
    return problem or compare("final_state", pick(final), ref_s, state_tolerance(x, final.dtype))

"""Float64 reference for RMSNorm forward and its variants (QuACK's rmsnorm_fwd semantics)."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def rmsnorm_fwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """h = x (+ residual); y = h * rsqrt(mean(h^2, -1) + eps) * w (+ bias), computed in float64.

    The variant is the inputs given: `residual` (M, N) makes it prenorm, `bias` (N,) is added after the
    weight. Every output comes back: y, residual_out = h (what a prenorm kernel stores, in the residual
    dtype) and rstd = 1 / sqrt(mean(h^2) + eps) per row; the gate checks those the kernel writes. As in
    QuACK, h is the unrounded sum: y is normalized from it, not from residual_out rounded to its dtype.
    """
    x = np.asarray(inputs["x"], dtype=np.float64)
    w = np.asarray(inputs["w"], dtype=np.float64)
    if x.ndim != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm expects x (M, N) and w (N,), got {x.shape} and {w.shape}")
    h = x
    if "residual" in inputs:
        r = np.asarray(inputs["residual"], dtype=np.float64)
        if r.shape != x.shape:
            raise ValueError(f"rmsnorm: residual must be {x.shape} like x, got {r.shape}")
        h = x + r
    ms = np.mean(h * h, axis=1, keepdims=True)
    y = h / np.sqrt(ms + float(scalars["eps"])) * w
    if "bias" in inputs:
        b = np.asarray(inputs["bias"], dtype=np.float64)
        if b.shape != w.shape:
            raise ValueError(f"rmsnorm: bias must be {w.shape} like w, got {b.shape}")
        y = y + b
    return {"y": y, "residual_out": h, "rstd": 1.0 / np.sqrt(ms[:, 0] + float(scalars["eps"]))}

"""Float64 reference for RMSNorm backward."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def rmsnorm_bwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """With xhat = x * rstd (rstd per row, as the forward stored it) and g = dout * w:
    dx = rstd * (g - xhat * mean(g * xhat, -1)),  dw = sum over rows of dout * xhat."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    w = np.asarray(inputs["w"], dtype=np.float64)
    dy = np.asarray(inputs["dout"], dtype=np.float64)
    rstd = np.asarray(inputs["rstd"], dtype=np.float64).reshape(-1, 1)
    if x.ndim != 2 or dy.shape != x.shape or w.shape != (x.shape[1],) or rstd.shape[0] != x.shape[0]:
        raise ValueError(f"rmsnorm_bwd expects x, dout (M, N), w (N,), rstd (M,); got {x.shape}, {dy.shape}, "
                         f"{w.shape}, {rstd.shape}")
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=1, keepdims=True))
    return {"dx": dx, "dw": np.sum(dy * xhat, axis=0)}

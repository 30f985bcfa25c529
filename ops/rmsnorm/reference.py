"""Float64 reference for RMSNorm forward."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def rmsnorm_fwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """y = x * rsqrt(mean(x^2, -1) + eps) * w, computed in float64."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    w = np.asarray(inputs["w"], dtype=np.float64)
    if x.ndim != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm expects x (M, N) and w (N,), got {x.shape} and {w.shape}")
    ms = np.mean(x * x, axis=1, keepdims=True)
    return {"y": x / np.sqrt(ms + float(scalars["eps"])) * w}

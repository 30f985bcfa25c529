"""Float64 reference for row-wise softmax."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def softmax_fwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """y = exp(x - max(x)) / sum(exp(x - max(x))) over the last dim, in float64."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"softmax expects x (M, N), got {x.shape}")
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}

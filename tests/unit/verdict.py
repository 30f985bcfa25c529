"""The device compare's verdict in numpy, for tests that judge host arrays the way the gate judges
device outputs: non-finite, any element outside atol + rtol * |ref|, or the relative-norm bound."""

from __future__ import annotations

import numpy as np

from evo.core.spec import Tolerance


def outside(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> bool:
    """True when the gate would call `got` wrong against the float64 `ref`."""
    if not np.all(np.isfinite(got)):
        return True
    d = np.abs(got - ref)
    if np.any(d > tol.atol + tol.rtol * np.abs(ref)):
        return True
    sref = float(np.sum(ref * ref))
    sdiff = float(np.sum(d * d))
    return not (np.sqrt(sdiff / sref) <= tol.rel_norm if sref > 0 else sdiff == 0.0)

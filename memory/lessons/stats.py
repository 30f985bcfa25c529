"""Small statistics: t quantiles, Welch's difference of means, Wilson bounds; params as text."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Z95 = 1.959964


def _t95(dof: float) -> float:
    """Two-sided 95% Student t quantile (Cornish-Fisher expansion; exact enough for dof >= 3)."""
    if not math.isfinite(dof) or dof > 1e6:
        return Z95
    if dof < 1.5:
        return 12.706
    if dof < 2.5:
        return 4.303
    z = Z95
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """mean(a) - mean(b), its standard error and Welch's degrees of freedom."""
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se2 = va + vb
    denom = (va**2 / (len(a) - 1) if len(a) > 1 else 0.0) + (vb**2 / (len(b) - 1) if len(b) > 1 else 0.0)
    dof = se2**2 / denom if denom > 0 else float(len(a) + len(b) - 2)
    return float(a.mean() - b.mean()), math.sqrt(se2), dof


def wilson_lower(k: int, n: int, z: float = Z95) -> float:
    """Lower end of the Wilson score interval for k successes in n: precision that accounts for support."""
    if n == 0:
        return 0.0
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def params_text(params: Mapping[str, Any]) -> str:
    """'a=1,b=nc': params sorted by name."""
    return ",".join(f"{k}={_show(v)}" for k, v in sorted(params.items()))

"""RMSNorm's hooks for the GPU worker: input fills, the float64 device reference, the torch baseline.

Standard library only, so the worker stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}

# (mean, std, row_shift) per input tensor and kind; mirrors make_inputs in spec.py.
FILLS = {
    "normal": {"x": (0.0, 1.0, 0.0), "w": (1.0, 0.1, 0.0)},
    "large": {"x": (0.0, 300.0, 200.0), "w": (1.0, 0.1, 0.0)},
}


def fills(kind: str, dims: Mapping[str, int]) -> dict[str, tuple[float, float, int, float]]:
    """tensor -> (mean, std, row_len, row_shift) for the worker's random fill."""
    if kind not in FILLS:
        raise ValueError(f"rmsnorm has no input kind {kind!r}; expected one of {sorted(FILLS)}")
    n = dims["N"]
    return {name: (m, s, n, sh) for name, (m, s, sh) in FILLS[kind].items()}


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """Launches (kernel, grid, block, args) that write float64 references into 'ref:<output>'."""
    m, n = dims["M"], dims["N"]
    kernel = f"rmsnorm_ref_{SHORT[dtypes['x']]}_{SHORT[dtypes['w']]}"
    args = (("buf", "x"), ("buf", "w"), ("buf", "ref:y"), ("i32", m), ("i32", n), ("f64", float(scalars["eps"])))
    return [(kernel, (m, 1, 1), (256, 1, 1), args)]


def tail_width(dims: Mapping[str, int]) -> int:
    """Columns at the end of a row counted as 'tail' in wrong-answer patterns."""
    return min(16, dims["N"])


def baseline(torch: Any) -> tuple[str, Callable[[Mapping[str, Any], Mapping[str, float]], Any]]:
    """torch.nn.functional.rms_norm on the worker's torch tensors."""

    def run(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        return torch.nn.functional.rms_norm(t["x"], (t["x"].shape[-1],), t["w"], s["eps"])

    return "torch.rms_norm", run

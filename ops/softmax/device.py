"""Softmax's hooks for the GPU worker: the float64 device reference and the torch baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """Launches (kernel, grid, block, args) that write float64 references into 'ref:y'."""
    m, n = dims["M"], dims["N"]
    args = (("buf", "x"), ("buf", "ref:y"), ("i32", m), ("i32", n))
    return [(f"softmax_ref_{SHORT[dtypes['x']]}", (m, 1, 1), (256, 1, 1), args)]


def tail_width(dims: Mapping[str, int]) -> int:
    return min(16, dims["N"])


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """torch.softmax over the last dim (eager, or compiled), or why a peer is absent."""
    from ops.baselines import absent_unless, compiled

    def eager(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        return torch.softmax(t["x"], dim=-1)

    makers = {"torch.softmax": lambda: eager, "torch.compile": lambda: compiled(torch, eager)}
    return {n: absent_unless(makers, n) for n in (names or ("torch.softmax",))}


def peer_outputs(name: str, result: Any) -> dict[str, Any]:
    """A peer's return value by output: y."""
    if isinstance(result, (tuple, list)):
        raise ValueError(f"softmax peer {name!r} returned a {len(result)}-tuple; expected y")
    return {"y": result}

"""Helpers for the ops' device hooks that name their peers (baselines): a peer that cannot be had is
reported absent with the reason, never replaced by something else."""

from __future__ import annotations

from typing import Any, Callable, Mapping

# torch.compile with Dynamo's recompile limit raised and hitting it an error (never a silent eager fallback): the
# exported benchmarks' own, shared with the gate's peers
from evo.core.torch_compile import RECOMPILE_LIMIT, compiled

__all__ = ["RECOMPILE_LIMIT", "absent_unless", "compiled"]


def absent_unless(makers: Mapping[str, Callable[[], Any]], name: str) -> Any:
    """makers[name]() (a callable baseline), or a one-line reason why it is absent."""
    if name not in makers:
        return f"no baseline named {name!r} for this op (known: {', '.join(sorted(makers))})"
    try:
        return makers[name]()
    except ImportError as e:
        return f"not installed: {e}"

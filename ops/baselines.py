"""Helpers for the ops' device hooks that name their peers (baselines): a peer that cannot be had is
reported absent with the reason, never replaced by something else."""

from __future__ import annotations

from typing import Any, Callable, Mapping


def absent_unless(makers: Mapping[str, Callable[[], Any]], name: str) -> Any:
    """makers[name]() (a callable baseline), or a one-line reason why it is absent."""
    if name not in makers:
        return f"no baseline named {name!r} for this op (known: {', '.join(sorted(makers))})"
    try:
        return makers[name]()
    except ImportError as e:
        return f"not installed: {e}"


def compiled(torch: Any, fn: Callable) -> Callable:
    """torch.compile of fn (inductor, static shapes); it compiles on its first call, outside timing."""
    return torch.compile(fn, dynamic=False)

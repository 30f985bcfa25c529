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


# Dynamo keeps this many compiled versions of one function (its code object) and then, by default,
# silently runs it eagerly: a bench over more shapes than that timed "torch.compile" as torch eager on its
# later cells (the H200 peers bench of 2026-12-03 hit the default of 8). Raised, and hitting it is an error
# (the peer is reported absent), never a silent fallback.
RECOMPILE_LIMIT = 4096


def compiled(torch: Any, fn: Callable) -> Callable:
    """torch.compile of fn (inductor, static shapes); it compiles on its first call, outside timing.
    Each shape gets its own compiled graph up to RECOMPILE_LIMIT; past it the call raises."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(cfg, name):
            setattr(cfg, name, max(RECOMPILE_LIMIT, getattr(cfg, name)))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(RECOMPILE_LIMIT, cfg.accumulated_recompile_limit)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False)

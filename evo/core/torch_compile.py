"""torch.compile as every benchmark here calls it: the gate's peers and the exported packages' benchmarks (the
runtime ships this file as its own `torch_compile.py`: evo/export/runtime/package/torch_compile.py is a link to it).
It imports nothing: torch is passed in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Dynamo keeps this many compiled versions of one function and then, by default, silently runs it eagerly: a
# benchmark over more shapes than that would time "torch.compile" as torch eager. Raised, and hitting it an error.
RECOMPILE_LIMIT = 4096


def compiled(torch: Any, fn: Callable) -> Callable:
    """torch.compile of fn (inductor, static shapes; it compiles on its first call, the check's, outside timing): a
    graph per shape up to RECOMPILE_LIMIT, past which the call raises (reported failed, never a silent eager run)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(cfg, name):
            setattr(cfg, name, max(RECOMPILE_LIMIT, getattr(cfg, name)))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(RECOMPILE_LIMIT, cfg.accumulated_recompile_limit)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False)

"""RMSNorm kernels exported by Kernel Factory from searched runs; README.md beside this package says
which runs, what they measured, and which path a shape takes (`explain`).

`import` needs neither torch nor a GPU: `explain`, `tables` and `provenance` read the shipped data;
`rmsnorm`, `rmsnorm_fwd`, `rmsnorm_bwd`, `RMSNorm` and `stats` import torch (and register the custom
ops) on first use.
"""

from __future__ import annotations

from .choose import PATHS, Choice, explain
from .lazy import on_first_use
from .table import provenance, tables

__all__ = ["PATHS", "Choice", "RMSNorm", "explain", "provenance", "rmsnorm", "rmsnorm_bwd", "rmsnorm_fwd", "stats",
           "tables"]
_TORCH_API = ("rmsnorm", "rmsnorm_fwd", "rmsnorm_bwd", "RMSNorm", "stats")
__getattr__ = on_first_use(__name__, "api", _TORCH_API)

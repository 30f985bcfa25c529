"""Kimi Delta Attention kernels exported by Kernel Factory from searched runs, on fla's surface;
README.md beside this package says which runs, what they measured, and which path a call takes
(`explain`).

`import` needs neither torch nor a GPU: `explain`, `tables` and `provenance` read the shipped data;
`fused_recurrent_kda`, `chunk_kda` and `stats` import torch on first use.
"""

from __future__ import annotations

from .choose import ENTRY_POINTS, PATHS, Choice, MissingKernel, explain
from .lazy import on_first_use
from .table import provenance, tables

__all__ = ["ENTRY_POINTS", "PATHS", "Choice", "MissingKernel", "chunk_kda", "explain", "fused_recurrent_kda",
           "provenance", "stats", "tables"]
_TORCH_API = ("fused_recurrent_kda", "chunk_kda", "stats")
__getattr__ = on_first_use(__name__, "api", _TORCH_API)

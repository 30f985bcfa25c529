"""The RMSNorm family's exporter (`kfactory export`): the package serves rmsnorm (forward) and
rmsnorm_bwd (backward) with a QuACK-compatible torch API, custom ops with autograd and a float32 torch
fallback; several forward runs (the plain op's and its variants') merge into one table. evo/export finds this module through OPS (see evo/export/family.py for the contract).
"""

from __future__ import annotations

from pathlib import Path

from ops.rmsnorm.export.readme import readme

OPS = {"rmsnorm": "forward", "rmsnorm_bwd": "backward"}
# a plain forward run and a run of the forward's variants (residual, bias, store_rstd: cta_row_fused) make
# one table: the runtime keys every call by its variant (choose.py)
MERGE = ("rmsnorm",)
NAME = "kf_rmsnorm"
DESCRIPTION = "RMSNorm CUDA kernels searched by Kernel Factory (runs {runs}), with a torch custom op and fallbacks"
RUNTIME = Path(__file__).with_name("runtime")

__all__ = ["DESCRIPTION", "MERGE", "NAME", "OPS", "RUNTIME", "readme"]

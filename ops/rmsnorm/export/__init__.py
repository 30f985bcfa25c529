"""The RMSNorm family's exporter (`kfactory export`): the package serves rmsnorm (forward) and
rmsnorm_bwd (backward) with a QuACK-compatible torch API, custom ops with autograd and a float32 torch
fallback. evo/export finds this module through OPS (see evo/export/family.py for the contract).
"""

from __future__ import annotations

from pathlib import Path

from ops.rmsnorm.export.readme import readme

OPS = {"rmsnorm": "forward", "rmsnorm_bwd": "backward"}
NAME = "kf_rmsnorm"
DESCRIPTION = "RMSNorm CUDA kernels searched by Kernel Factory (runs {runs}), with a torch custom op and fallbacks"
RUNTIME = Path(__file__).with_name("runtime")

__all__ = ["DESCRIPTION", "NAME", "OPS", "RUNTIME", "readme"]

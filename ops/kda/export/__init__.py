"""The KDA family's exporter (`kfactory export`): the package serves kda (forward) on fla's surface,
`fused_recurrent_kda` (decode: the recurrent templates) and `chunk_kda` (prefill: the chunk* templates),
with a float32 torch path for what the kernels do not compute. A decode run and a prefill run (no cell in
common) export into one package (MERGE). evo/export finds this module through OPS (see
evo/export/family.py for the contract).
"""

from __future__ import annotations

from pathlib import Path

from ops.kda.export.readme import readme

OPS = {"kda": "forward"}
MERGE = ("kda",)  # a decode run and a prefill run into one table: both entry points served by one package
NAME = "kf_kda"
DESCRIPTION = ("Kimi Delta Attention CUDA kernels searched by Kernel Factory (runs {runs}), on fla's "
               "fused_recurrent_kda / chunk_kda surface, with a torch fallback")
RUNTIME = Path(__file__).with_name("runtime")

__all__ = ["DESCRIPTION", "MERGE", "NAME", "OPS", "RUNTIME", "readme"]

"""A store with a plain RMSNorm forward run (export_fixtures.RUN) and a run of the forward's variants
(VAR_RUN) over cta_row_fused, for the export tests of the variants: the real templates, real NVRTC
builds for sm_90a (cubins in the store, as a run leaves them), evaluations with planted times.

VAR_RUN's table (best per cell), with the genomes the committed H200 residual run picked
(experiments/seeds/rmsnorm_residual_h200.json) at N = 1024 and 4096:
- residual bf16, bf16 M32768 N1024          -> cta_row_fused(threads=128, vec=8)  (threads=256, vec=4 slower)
- residual bf16, bf16 M32768 N4096          -> cta_row_fused(threads=512, vec=4, min_blocks=2, ...)
- residual fp16, fp16 M32768 N1024          -> cta_row_fused(threads=128, vec=8)
- residual fp32 (the stream), bf16 M32768 N4096 -> cta_row_fused(threads=512, vec=4, min_blocks=2, ...)
- bias, bf16 M32768 N1024                   -> cta_row_fused(threads=128, vec=8)
- store_rstd, bf16 M32768 N1024             -> cta_row_fused(threads=128, vec=8)
- residual + bias + store_rstd, bf16 M32768 N4096 -> cta_row_fused(threads=512, vec=4, min_blocks=2, ...)
"""

from __future__ import annotations

from typing import Any

from evo.build.nvrtc import Builder, prepare
from memory import RunRow, SourceRow, Store
from ops.rmsnorm.spec import cell
from evo.core.spec import Cell
from tests.unit import export_fixtures as fx

VAR_RUN = "exp-var"
N1K = ("cta_row_fused", {"threads": 128, "vec": 8, "min_blocks": 1, "weight_early": False, "load_hint": "nc",
                         "store_hint": "wb"})
N4K = ("cta_row_fused", {"threads": 512, "vec": 4, "min_blocks": 2, "weight_early": True, "load_hint": "cg",
                         "store_hint": "cg"})
SLOW_1K = ("cta_row_fused", {**N1K[1], "threads": 256, "vec": 4})
M = 32768
RES_BF16_1K = cell("bf16", M, 1024, residual=True)
RES_BF16_4K = cell("bf16", M, 4096, residual=True)
RES_FP16_1K = cell("fp16", M, 1024, residual=True)
RES32_BF16_4K = cell("bf16", M, 4096, residual="fp32")
BIAS_1K = cell("bf16", M, 1024, bias=True)
RSTD_1K = cell("bf16", M, 1024, store_rstd=True)
ALL_4K = cell("bf16", M, 4096, residual=True, bias=True, store_rstd=True)
# cell -> [(genome, median us)]
VAR_PLAN: dict[Cell, list[tuple[tuple[str, dict[str, Any]], float]]] = {
    RES_BF16_1K: [(N1K, 68.0), (SLOW_1K, 75.0)],
    RES_BF16_4K: [(N4K, 260.0)],
    RES_FP16_1K: [(N1K, 68.1)],
    RES32_BF16_4K: [(N4K, 391.1)],
    BIAS_1K: [(N1K, 40.0)],
    RSTD_1K: [(N1K, 39.0)],
    ALL_4K: [(N4K, 265.0)],
}


def build_variants() -> dict[tuple[str, str], Any]:
    """Real NVRTC builds of every (genome, cell) of VAR_PLAN: (genome key, cell label) -> (input, result)."""
    inputs = {}
    for c, rows in VAR_PLAN.items():
        for (t, p), _ in rows:
            g = fx.genome(t, p)
            inputs[(g.key(), c.label())] = prepare(fx.TEMPLATES[t], g, fx.ARCH, c.dtypes_dict(), c.dims_dict())
    with Builder(2) as b:
        results = {r.build_key: r for r in b.build(list({bi.key(): bi for bi in inputs.values()}.values()))}
    return {k: (bi, results[bi.key()]) for k, bi in inputs.items()}


def write_variant_run(store: Store, built: dict[tuple[str, str], Any], run_id: str = VAR_RUN) -> None:
    """VAR_PLAN as one finished run of op rmsnorm (what a run of the "residual" and "bias_rstd" matrices
    leaves), cta_row_fused's text recorded as the run's source."""
    rows: list[Any] = [RunRow(run_id=run_id, op="rmsnorm", arch=fx.ARCH, config_toml="# variant export fixture\n",
                              config_hash=f"h-{run_id}", seed=0, status="running")]
    t = fx.TEMPLATES["cta_row_fused"]
    rows.append(SourceRow.of(t.text, op="rmsnorm", template=t.name, origin="file"))
    seen: set[str] = set()
    for c, entries in VAR_PLAN.items():
        for (tname, p), us in entries:
            g = fx.genome(tname, p)
            bi, r = built[(g.key(), c.label())]
            rows += fx.entry_rows(seen, run_id, "rmsnorm", tname, g, bi, r, c, us, "torch.rms_norm", base=1.2 * us)
    store.write(rows)
    store.finish_run(run_id, "done", "fixture")

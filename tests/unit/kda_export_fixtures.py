"""A small store with a finished KDA decode run for the export tests: the real recurrent template, real
NVRTC builds for sm_90a (cubins in the store, as a run leaves them), and evaluations with planted times
(the template's numerics are checked by tests/unit/test_kda_recurrent.py, its emulation through the real
gate on the numpy fake device included).

Run RUN's table (best per cell), bf16, T = 1, H = HV = 32, K = V = 128, fp32 g and state:
- B1, B16, B64          -> recurrent(v_tile=32, vec=4, k_lanes=8)   (one build: B is not compiled in)
- B256                  -> recurrent(v_tile=64, vec=4, k_lanes=8)   (WIDE slower on B1)
- B16 with qk_l2norm and a sigmoid beta (fla's use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel)
                        -> recurrent(v_tile=32, ...) again, another build (both variants are compiled in)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evo.build.nvrtc import Builder, BuildInput, prepare
from evo.core.genome import Genome
from evo.templates.sandbox import TEMPLATES_ROOT
from evo.templates.template import parse_template
from memory import RunRow, SourceRow, Store
from ops.kda.reference import BetaAct, Variant
from ops.kda.spec import cell
from evo.core.spec import Cell
from tests.unit.export_fixtures import entry_rows

ARCH = "sm_90a"
RUN = "kda-r1"
FP = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580.00", "nvrtc": "nvrtc-13.5"}
FP_CLASS = "NVIDIA H200|sm_90|580.00"
# the recurrent template only: other kda templates (the chunked prefill one) are not this run's
_PATH = TEMPLATES_ROOT / "kda" / "recurrent.cu.j2"
TEMPLATES = {"recurrent": parse_template(_PATH.read_text(), str(_PATH), trusted=True)}
BASE = {"min_blocks": 1, "load_hint": "nc", "store_hint": "wb"}
WIN = ("recurrent", {**BASE, "v_tile": 32, "vec": 4, "k_lanes": 8})
WIDE = ("recurrent", {**BASE, "v_tile": 64, "vec": 4, "k_lanes": 8})
NARROW = ("recurrent", {**BASE, "v_tile": 16, "vec": 2, "k_lanes": 16})
L2_SIGMOID = Variant(beta_act=BetaAct.SIGMOID, qk_l2norm=True)
FLA_DEFAULT = Variant()


def decode(b: int, variant: Variant = FLA_DEFAULT) -> Cell:
    return cell("bf16", b, 1, 32, variant=variant)


# cell -> [(genome, median us)]
PLAN: dict[Cell, list[tuple[tuple[str, dict], float]]] = {
    decode(1): [(WIN, 4.0), (WIDE, 4.5)],
    decode(16): [(WIN, 9.0), (NARROW, 11.0)],
    decode(64): [(WIN, 30.0)],
    decode(256): [(WIDE, 110.0), (WIN, 118.0)],
    decode(16, L2_SIGMOID): [(WIN, 9.5)],
}


def genome(template: str, params: dict[str, Any]) -> Genome:
    """The fixture's point over today's defaults (a parameter the template gained since takes its default)."""
    t = TEMPLATES[template]
    return Genome.make("kda", template, t.source_hash, t.default_params() | params)


@dataclass
class Built:
    inputs: dict[tuple, BuildInput]  # (genome key, cell label) -> build input
    results: dict[str, Any]  # build key -> BuildResult


def build_all() -> Built:
    """Real NVRTC builds of every (genome, cell) of PLAN."""
    inputs = {}
    for c, rows in PLAN.items():
        for (t, p), _ in rows:
            g = genome(t, p)
            inputs[(g.key(), c.label())] = prepare(TEMPLATES[t], g, ARCH, c.dtypes_dict(), c.dims_dict())
    with Builder(2) as b:
        results = {r.build_key: r for r in b.build(list({bi.key(): bi for bi in inputs.values()}.values()))}
    return Built(inputs, results)


def write_run(store: Store, built: Built, run_id: str = RUN) -> None:
    """RUN in the store, finished."""
    rows: list[Any] = [RunRow(run_id=run_id, op="kda", arch=ARCH, config_toml="# kda export fixture\n",
                              config_hash=f"h-{run_id}", seed=0, status="running")]
    rows += [SourceRow.of(t.text, op="kda", template=t.name, origin="file") for t in TEMPLATES.values()]
    seen: set[str] = set()
    for c, entries in PLAN.items():
        for (t, p), us in entries:
            g = genome(t, p)
            bi = built.inputs[(g.key(), c.label())]
            r = built.results[bi.key()]
            assert r.status.ok, (t, p, c.label(), r.error)
            rows += entry_rows(seen, run_id, "kda", t, g, bi, r, c, us, "fla.fused_recurrent_kda", base=1.2 * us,
                               fp=FP, fp_class=FP_CLASS, arch=ARCH)
    store.write(rows)
    store.finish_run(run_id, "done", "fixture")


# A second run, of the chunked prefill template on one small prefill cell: exported together with RUN, one
# package serves both entry points (ops/kda/export MERGE).
PREFILL_RUN = "kda-p1"
_CHUNK_PATH = TEMPLATES_ROOT / "kda" / "chunk.cu.j2"
CHUNK = parse_template(_CHUNK_PATH.read_text(), str(_CHUNK_PATH), trusted=True)
PREFILL_CELL = cell("bf16", 1, 256, 2)


def write_prefill_run(store: Store, run_id: str = PREFILL_RUN, params: dict | None = None) -> Genome:
    """PREFILL_RUN in the store, finished: the chunk template's default point (or it with `params` over it) on
    PREFILL_CELL (a real sm_90a build); the genome."""
    g = Genome.make("kda", "chunk", CHUNK.source_hash, CHUNK.default_params() | (params or {}))
    bi = prepare(CHUNK, g, ARCH, PREFILL_CELL.dtypes_dict(), PREFILL_CELL.dims_dict())
    with Builder(1) as b:
        (r,) = b.build([bi])
    assert r.status.ok, r.error
    rows: list[Any] = [RunRow(run_id=run_id, op="kda", arch=ARCH, config_toml="# kda prefill export fixture\n",
                              config_hash=f"h-{run_id}", seed=0, status="running"),
                       SourceRow.of(CHUNK.text, op="kda", template="chunk", origin="file")]
    rows += entry_rows(set(), run_id, "kda", "chunk", g, bi, r, PREFILL_CELL, 50.0, "fla.chunk_kda", base=90.0,
                       fp=FP, fp_class=FP_CLASS, arch=ARCH)
    store.write(rows)
    store.finish_run(run_id, "done", "fixture")
    return g


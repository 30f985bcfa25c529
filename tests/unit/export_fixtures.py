"""A small store with finished RMSNorm runs for the export tests: the real templates, real NVRTC builds
for sm_90a (cubins in the store, as a run leaves them), and evaluations with planted times.

Run RUN's table (best per cell):
- bf16 M4096 N1024  -> cta_row(threads=128, vec=8)   (cta_row(threads=64, vec=8) slower)
- bf16 M4096 N8192  -> cta_row(threads=512, vec=8)   (warp_row slower; a faster WRONG_ANSWER has no time)
- bf16 M32768 N8192 -> cta_row(threads=512, vec=8)   (the same build as M4096: N is compiled in, M is not)
- fp32 M4096 N1024  -> warp_row(threads=128, vec=4)
- fp32 M4096 N4096  -> warp_row(threads=128, vec=4)  (the same build: warp_row compiles nothing in)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evo.build.nvrtc import Builder, BuildInput, prepare
from evo.core.genome import Genome
from evo.templates.template import TemplateDef, load_templates
from memory import BuildRow, CandidateRow, EvaluationRow, RunRow, SourceRow, Store
from ops.rmsnorm.spec import cell
from evo.core.spec import Cell

ARCH = "sm_90a"
RUN = "exp-r1"
FP = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580.00", "nvrtc": "nvrtc-13.5"}
FP_CLASS = "NVIDIA H200|sm_90|580.00"
TEMPLATES = load_templates("rmsnorm")
CTA = {"min_blocks": 1, "weight_early": False, "load_hint": "nc", "store_hint": "wb"}
WARP = {"unroll": 2, "rows_per_warp": 1, "cache_items": 8, "load_hint": "nc", "store_hint": "wb"}
WIN_1K = ("cta_row", {**CTA, "threads": 128, "vec": 8})
WIN_8K = ("cta_row", {**CTA, "threads": 512, "vec": 8})
WIN_FP32 = ("warp_row", {**WARP, "threads": 128, "vec": 4})
LOSE_1K = ("cta_row", {**CTA, "threads": 64, "vec": 8})
LOSE_8K = ("warp_row", {**WARP, "threads": 256, "vec": 8})
WRONG_8K = ("cta_row", {**CTA, "threads": 256, "vec": 8})
# (dtype, M, N) -> [(genome, median us or None for a WRONG_ANSWER)]
PLAN = {
    ("bf16", 4096, 1024): [(WIN_1K, 4.0), (LOSE_1K, 5.0)],
    ("bf16", 4096, 8192): [(WIN_8K, 20.0), (LOSE_8K, 26.0), (WRONG_8K, None)],
    ("bf16", 32768, 8192): [(WIN_8K, 150.0), (LOSE_8K, 180.0)],
    ("fp32", 4096, 1024): [(WIN_FP32, 8.0)],
    ("fp32", 4096, 4096): [(WIN_FP32, 30.0)],
}


def genome(template: str, params: dict[str, Any], templates: dict[str, TemplateDef] | None = None) -> Genome:
    return Genome.make("rmsnorm", template, (templates or TEMPLATES)[template].source_hash, params)


@dataclass
class Built:
    inputs: dict[tuple, BuildInput]  # (genome key, cell label) -> build input
    results: dict[str, Any]  # build key -> BuildResult


def build_all(plan: dict | None = None, templates: dict[str, TemplateDef] | None = None) -> Built:
    """Real NVRTC builds of every (genome, cell) of PLAN (or `plan`, with `templates` instead of today's)."""
    templates = templates or TEMPLATES
    inputs = {}
    for (dt, m, n), rows in (PLAN if plan is None else plan).items():
        c = cell(dt, m, n)
        for (t, p), _ in rows:
            g = genome(t, p, templates)
            inputs[(g.key(), c.label())] = prepare(templates[t], g, ARCH, c.dtypes_dict(), c.dims_dict())
    with Builder(2) as b:
        results = {r.build_key: r for r in b.build(list({bi.key(): bi for bi in inputs.values()}.values()))}
    return Built(inputs, results)


def entry_rows(seen: set[str], run_id: str, op: str, template: str, g: Genome, bi: Any, r: Any, c: Cell,
               us: float | None, baseline: str, base: float, cubin: bytes | None = None, fp: dict | None = None,
               fp_class: str | None = None, arch: str = ARCH) -> list[Any]:
    """The rows of one fixture entry: its candidate and its build (each the first time `seen` meets it) and
    its evaluation, OK at `us` against `baseline` at `base` us, or WRONG_ANSWER where us is None or 0."""
    rows: list[Any] = []
    if g.key() not in seen:
        seen.add(g.key())
        rows.append(CandidateRow(genome_key=g.key(), op=op, template=template, source_hash=g.source_hash,
                                 params_json=g.params_json(), origin="init", parents_json="[]", run_id=run_id,
                                 generation=0))
    if bi.key() not in seen:
        seen.add(bi.key())
        rows.append(BuildRow(build_key=bi.key(), genome_key=g.key(), run_id=run_id, arch=arch,
                             dtypes_json=json.dumps(dict(bi.dtypes), sort_keys=True),
                             consts_json=json.dumps(dict(bi.consts), sort_keys=True), status=r.status.value,
                             regs=r.regs, spill_stores=r.spill_stores, compile_ms=r.compile_ms,
                             compiler=r.compiler, log=r.log, cubin=r.cubin if cubin is None else cubin))
    rows.append(EvaluationRow(
        eval_id=f"{run_id}:{g.key()[:12]}:{c.label()}", run_id=run_id, genome_key=g.key(),
        build_key=bi.key(), cell=c.label(), dtypes_json=json.dumps(c.dtypes_dict(), sort_keys=True),
        dims_json=json.dumps(c.dims_dict(), sort_keys=True), status="OK" if us else "WRONG_ANSWER",
        median_us=us, p10_us=us and 0.98 * us, p90_us=us and 1.03 * us, samples=100 if us else None,
        baseline=baseline, baseline_us=base if us else None, speedup=base / us if us else None,
        error=None if us else "tail elements wrong", fingerprint_json=json.dumps(fp or FP, sort_keys=True),
        fingerprint_class=fp_class or FP_CLASS, generation=0, source="replay"))
    return rows


def write_run(store: Store, built: Built, run_id: str = RUN, status: str = "done", plan: dict | None = None,
              corrupt_cubin: bool = False, templates: dict[str, TemplateDef] | None = None) -> None:
    """One run of PLAN (or `plan`) in the store, finished with `status`; its templates are today's files
    (or `templates`, as the run recorded them)."""
    plan = PLAN if plan is None else plan
    templates = templates or TEMPLATES
    rows: list[Any] = [RunRow(run_id=run_id, op="rmsnorm", arch=ARCH, config_toml="# export fixture\n",
                              config_hash=f"h-{run_id}", seed=0, status="running")]
    rows += [SourceRow.of(t.text, op="rmsnorm", template=t.name, origin="file") for t in templates.values()]
    seen: set[str] = set()
    for (dt, m, n), entries in plan.items():
        c = cell(dt, m, n)
        for (t, p), us in entries:
            g = genome(t, p, templates)
            bi = built.inputs[(g.key(), c.label())]
            r = built.results[bi.key()]
            cubin = r.cubin[:-1] + bytes([r.cubin[-1] ^ 1]) if corrupt_cubin else r.cubin
            rows += entry_rows(seen, run_id, "rmsnorm", t, g, bi, r, c, us, "torch.rms_norm", base=1.3 * (us or 10.0),
                               cubin=cubin)
    store.write(rows)
    store.finish_run(run_id, status, "fixture")


def make_store(path: Path, built: Built) -> Path:
    """RUN (done), 'exp-running' (running), 'exp-empty' (done, no OK result), 'exp-r2' (a second done run)."""
    with Store.open(path) as store:
        write_run(store, built)
        write_run(store, built, "exp-running", status="running")
        write_run(store, built, "exp-empty", plan={("bf16", 4096, 8192): [(WRONG_8K, None)]})
        write_run(store, built, "exp-r2", plan={("bf16", 4096, 1024): [(LOSE_1K, 5.0)]})
    return path


def pip_install(src_tree: Path, work: Path) -> Path:
    """`pip install --no-deps --target` of an exported package from a copy of it (pip writes build files
    into the tree it installs); returns the target folder."""
    src = work / "src" / src_tree.name
    shutil.copytree(src_tree, src)
    target = work / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return target

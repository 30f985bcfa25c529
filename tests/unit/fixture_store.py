"""A small hand-made lesson store with planted facts, for the lesson and notebook tests.

Two templates, 80 genomes, five cells (plus one that replay never recorded), two runs. Planted:
- vec=8 is 20% faster than vec=4 (time x 1.25 for vec=4), in every cell and template;
- warp_row(vec=8, threads=128, unroll=2, cache_items=8) is the champion of every N <= 2048 cell,
  cta_row(vec=8, threads=256, min_blocks=1, weight_early=true) of every N > 8192 cell;
- cta_row with threads=1024 and min_blocks=2 fails to build (RESOURCE_ERROR, ptxas message with
  varying names and numbers), and the pipeline mirrors that status into one evaluation per cell;
- warp_row with vec=8 and unroll=4 gives WRONG_ANSWER 'tail elements wrong' on every cell;
- one TIMEOUT of an otherwise good genome (a cluster too small to become a rule);
- UNKNOWN evaluations: every genome of run 2 on the unrecorded cell, and every evaluation of
  cta_row threads=128 min_blocks=1 (a condition that would look like a perfect rule if counted).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from evo.core.genome import Genome
from memory import BuildRow, CandidateRow, EvaluationRow, LessonUseRow, RunRow, Store, source_hash

OP, ARCH = "rmsnorm", "sm_90a"
FP_CLASS = "NVIDIA H200|sm_90|580.00"
FP_JSON = json.dumps({"gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580.00"}, sort_keys=True)
RUN1, RUN2, RUN3 = "fx-r1", "fx-r2", "fx-r3"
T0 = datetime(2026, 1, 5, 9, 0, 0)
CELLS = (  # (dtype, M, N)
    ("bfloat16", 4096, 1024),
    ("bfloat16", 4096, 2048),
    ("bfloat16", 4096, 16384),
    ("bfloat16", 32768, 16384),
    ("float32", 4096, 1024),
)
UNKNOWN_CELL = ("bfloat16", 32768, 1024)
SPACE: dict[str, dict[str, list[Any]]] = {
    "warp_row": {"vec": [4, 8], "threads": [64, 128, 256, 512], "unroll": [1, 2, 4], "cache_items": [0, 8]},
    "cta_row": {"vec": [4, 8], "threads": [128, 256, 512, 1024], "min_blocks": [1, 2], "weight_early": [True, False]},
}
CHAMP_SMALL = ("warp_row", {"vec": 8, "threads": 128, "unroll": 2, "cache_items": 8})
CHAMP_LARGE = ("cta_row", {"vec": 8, "threads": 256, "min_blocks": 1, "weight_early": True})
RESOURCE_CONDITION = ("cta_row", {"threads": 1024, "min_blocks": 2})
WRONG_CONDITION = ("warp_row", {"vec": 8, "unroll": 4})
UNKNOWN_CONDITION = ("cta_row", {"threads": 128, "min_blocks": 1})
TIMEOUT_GENOME = ("warp_row", {"vec": 4, "threads": 64, "unroll": 1, "cache_items": 0})
VEC4_SLOWDOWN = 1.25
_THREADS = {
    "warp_row": {64: 1.10, 128: 1.0, 256: 1.03, 512: 1.08},
    "cta_row": {128: 1.05, 256: 1.0, 512: 1.02, 1024: 1.06},
}
_SHORT = {"bfloat16": "bf16", "float32": "fp32"}
_NBYTES = {"bfloat16": 2, "float32": 4}


def label(cell: tuple[str, int, int]) -> str:
    """The pipeline's cell label, e.g. 'w=bf16,x=bf16 M4096-N1024'."""
    dt, m, n = cell
    return f"w={_SHORT[dt]},x={_SHORT[dt]} M{m}-N{n}"


def genome(template: str, params: dict[str, Any]) -> Genome:
    return Genome.make(OP, template, source_hash(f"// {template} fixture"), params)


def matches(params: dict[str, Any], condition: dict[str, Any]) -> bool:
    return all(params.get(k) == v for k, v in condition.items())


def genomes() -> list[Genome]:
    """Every point of SPACE, in a fixed order."""
    out = []
    for template, space in SPACE.items():
        names = sorted(space)
        for values in itertools.product(*(space[n] for n in names)):
            out.append(genome(template, dict(zip(names, values))))
    return out


def base_us(cell: tuple[str, int, int]) -> float:
    """Time of a perfect kernel: read and write M*N elements at 3 TB/s."""
    dt, m, n = cell
    return 2 * m * n * _NBYTES[dt] / 3.0e6


def planted_us(g: Genome, cell: tuple[str, int, int]) -> float:
    """The noiseless time of a genome on a cell."""
    p, n = g.params_dict(), cell[2]
    t = base_us(cell) * (1.0 if p["vec"] == 8 else VEC4_SLOWDOWN) * _THREADS[g.template][p["threads"]]
    if g.template == "warp_row":
        t *= 1.0 if n <= 2048 else 1.3
    else:
        t *= 1.2 if n <= 2048 else 1.0
    if (g.template, p) == CHAMP_SMALL and n <= 2048:
        t *= 0.85
    if (g.template, p) == CHAMP_LARGE and n > 8192:
        t *= 0.85
    return t


def build_key(g: Genome, cell: tuple[str, int, int]) -> str:
    return hashlib.sha256(f"{g.key()}|{ARCH}|{cell[0]}|{cell[2]}".encode()).hexdigest()


@dataclass
class _Writer:
    """Collects rows with deterministic ids and times."""

    rng: random.Random
    rows: list[Any]
    n: int = 0

    def stamp(self, run_id: str) -> datetime:
        self.n += 1
        return T0 + timedelta(hours={RUN1: 0, RUN2: 1, RUN3: 2}[run_id], seconds=self.n)

    def evaluation(
        self,
        run_id: str,
        g: Genome,
        cell: tuple[str, int, int],
        status: str,
        gen: int,
        median_us: float | None = None,
        error: str | None = None,
    ) -> EvaluationRow:
        dt, m, n = cell
        base = base_us(cell) * 1.3
        ok = status == "OK"
        row = EvaluationRow(
            eval_id=f"{run_id}-e{self.n:05d}",
            run_id=run_id,
            genome_key=g.key(),
            build_key=build_key(g, cell),
            cell=label(cell),
            dtypes_json=json.dumps({"w": dt, "x": dt}, sort_keys=True),
            dims_json=json.dumps({"M": m, "N": n}, sort_keys=True),
            status=status,
            median_us=median_us if ok else None,
            p10_us=0.98 * median_us if ok else None,
            p90_us=1.02 * median_us if ok else None,
            samples=100 if ok else None,
            gbps=2 * m * n * _NBYTES[dt] / median_us / 1e3 if ok else None,
            ceiling_gbps=4000.0,
            baseline="torch.rms_norm",
            baseline_us=base,
            speedup=base / median_us if ok else None,
            error=error,
            fingerprint_json=FP_JSON,
            fingerprint_class=FP_CLASS,
            generation=gen,
            source="gpu",
            created_at=self.stamp(run_id),
        )
        self.rows.append(row)
        return row


def _resource_error(g: Genome, cell: tuple[str, int, int]) -> str:
    n = cell[2]
    return (
        f"ptxas error   : Entry function '_Z15rmsnorm_cta_rowILi{n}ELi{g.param('threads')}EEvPKvS1_Pvii' "
        f"uses too much shared data (0x{0xC000 + 64 * n:x} bytes, 0xc000 max)"
    )


def _wrong_answer(rng: random.Random, cell: tuple[str, int, int]) -> str:
    _, m, n = cell
    bad = rng.randint(3, 60)
    return (
        f"y on input set {rng.randint(0, 2)}: tail elements wrong ({bad} bad, 0 non-finite, 0 canary bytes "
        f"of {m * n}; first bad index {n - bad}; max abs err {rng.uniform(0.1, 2):.3g}; rel norm 0.0123)"
    )


def fixture_rows(seed: int = 7) -> list[Any]:
    """Every row of the fixture store (runs 1 and 2), in write order."""
    rng = random.Random(seed)
    w = _Writer(rng, [])
    w.rows += [
        RunRow(
            run_id=r,
            op=OP,
            arch=ARCH,
            config_toml="# fixture",
            config_hash="fx",
            seed=0,
            status="done",
            created_at=T0 + timedelta(hours=h),
        )
        for h, r in enumerate((RUN1, RUN2))
    ]
    all_genomes = genomes()
    repeats = {g.key() for g in all_genomes[::2][:5]}  # run 2 measures five of run 1's genomes again
    proposed: set[str] = set()
    for i, g in enumerate(all_genomes):
        for run_id in (RUN1, RUN2):
            if not (i % 2 == (0 if run_id == RUN1 else 1) or (run_id == RUN2 and g.key() in repeats)):
                continue
            gen = i % 3
            p = g.params_dict()
            if g.key() not in proposed:
                proposed.add(g.key())
                w.rows.append(
                    CandidateRow(
                        genome_key=g.key(),
                        op=OP,
                        template=g.template,
                        source_hash=g.source_hash,
                        params_json=g.params_json(),
                        origin="init",
                        parents_json="[]",
                        run_id=run_id,
                        generation=gen,
                        created_at=w.stamp(run_id),
                    )
                )
            cells = list(CELLS) + ([UNKNOWN_CELL] if run_id == RUN2 else [])
            for cell in cells:
                resource = g.template == RESOURCE_CONDITION[0] and matches(p, RESOURCE_CONDITION[1])
                w.rows.append(
                    BuildRow(
                        build_key=build_key(g, cell),
                        genome_key=g.key(),
                        run_id=run_id,
                        arch=ARCH,
                        dtypes_json=json.dumps({"w": cell[0], "x": cell[0]}, sort_keys=True),
                        consts_json=json.dumps({"N": cell[2]}),
                        status="RESOURCE_ERROR" if resource else "OK",
                        regs=None if resource else 32,
                        error=_resource_error(g, cell) if resource else None,
                        created_at=w.stamp(run_id),
                    )
                )
                if resource:
                    w.evaluation(run_id, g, cell, "RESOURCE_ERROR", gen, error=_resource_error(g, cell))
                elif cell == UNKNOWN_CELL or (g.template == UNKNOWN_CONDITION[0] and matches(p, UNKNOWN_CONDITION[1])):
                    w.evaluation(
                        run_id, g, cell, "UNKNOWN", gen, error="no recorded measurement for this genome and cell"
                    )
                elif g.template == WRONG_CONDITION[0] and matches(p, WRONG_CONDITION[1]):
                    w.evaluation(run_id, g, cell, "WRONG_ANSWER", gen, error=_wrong_answer(rng, cell))
                elif (g.template, p) == TIMEOUT_GENOME and cell == CELLS[0] and run_id == RUN1:
                    w.evaluation(run_id, g, cell, "TIMEOUT", gen, error="worker timed out after 60.0 s")
                else:
                    w.evaluation(
                        run_id, g, cell, "OK", gen, median_us=planted_us(g, cell) * math.exp(rng.gauss(0, 0.01))
                    )
    return w.rows


def credit_rows(store: Store) -> list[Any]:
    """Run 3, which used three lessons: a cell champion seeded the small-N champion (it does well again),
    a vec param-effect lesson biased a genome that then failed (WRONG_ANSWER), and the wrong-answer failure
    rule was checked on a genome that indeed failed. Needs the lessons of runs 1 and 2 in the store."""
    from memory import queries as q

    w = _Writer(random.Random(3), [])
    w.rows.append(
        RunRow(
            run_id=RUN3,
            op=OP,
            arch=ARCH,
            config_toml="# fixture",
            config_hash="fx",
            seed=3,
            status="done",
            created_at=T0 + timedelta(hours=2),
        )
    )
    good, bad = genome(*CHAMP_SMALL), genome("warp_row", {"vec": 8, "threads": 256, "unroll": 4, "cache_items": 0})
    slow = genome("warp_row", {"vec": 4, "threads": 512, "unroll": 1, "cache_items": 0})
    for cell in CELLS[:2]:
        w.evaluation(RUN3, good, cell, "OK", 0, median_us=planted_us(good, cell))
        w.evaluation(RUN3, bad, cell, "WRONG_ANSWER", 0, error=_wrong_answer(w.rng, cell))
        w.evaluation(RUN3, slow, cell, "OK", 0, median_us=planted_us(slow, cell))
    ls = q.lessons(store, OP, ARCH)
    scopes = [(r.lesson_id, r.kind, json.loads(r.scope_json)) for r in ls.itertuples()]
    champ = next(i for i, k, s in scopes if k == q.CHAMPION and s.get("cell") == label(CELLS[0]))
    vec = next(i for i, k, s in scopes if k == q.PARAM_EFFECT and s["template"] == "warp_row" and s["param"] == "vec")
    rule = next(i for i, k, s in scopes if k == q.FAILURE and s["status"] == "WRONG_ANSWER")
    w.rows += [
        LessonUseRow(genome_key=good.key(), lesson_id=champ, run_id=RUN3, effect="seeded"),
        LessonUseRow(genome_key=bad.key(), lesson_id=vec, run_id=RUN3, effect="biased"),
        LessonUseRow(genome_key=bad.key(), lesson_id=rule, run_id=RUN3, effect="checked"),
        LessonUseRow(genome_key=slow.key(), lesson_id=rule, run_id=RUN3, effect="rejected"),
    ]
    return w.rows


def build_fixture_store(path: str | Path, *, lessons: bool = False) -> Path:
    """Write the fixture store at path; with lessons, also extract them and add run 3 with its lesson uses."""
    path = Path(path)
    with Store.open(path) as store:
        store.write(fixture_rows())
    return add_lessons(path) if lessons else path


def add_lessons(path: str | Path) -> Path:
    """Extract the lessons of runs 1 and 2 into the fixture store at path, then add run 3 and score its uses."""
    from memory.lessons import refresh_lessons, update_usefulness

    path = Path(path)
    with Store.open(path) as store:
        refresh_lessons(store, OP, ARCH, RUN2)
        store.write(credit_rows(store))
        update_usefulness(store, RUN3)
    return path


if __name__ == "__main__":
    import sys

    print(build_fixture_store(sys.argv[1] if len(sys.argv) > 1 else "fixture.duckdb", lessons=True))

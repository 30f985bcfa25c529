"""The search loop's use of the lesson store: warm start, failure memory, priors, credit, extraction.

Each use can be switched off in `[lessons]` for ablations. Every use is recorded in `lesson_uses`
(which lesson touched which genome, and how), and lessons are re-extracted from the whole store
during and at the end of a run, so the next run starts from more evidence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.loop.generation import Generation
from evo.loop.pipeline import Session
from evo.search.failure_memory import failure_predictor
from evo.search.priors import param_priors, prior_sources
from evo.search.warm_start import dims_distance, warm_start
from memory import lessons as L
from memory import queries as Q
from memory.rows import CandidateRow, Row
from evo.core.spec import Cell

LET_THROUGH = 0.1  # share of predicted failures evaluated anyway, to measure the rules' precision
REFRESH_EVERY = 3  # generations between lesson re-extractions (and at the end of a run)


def _repaired_onto_cells(session: Session, g: Genome) -> list[Genome]:
    """The nearest legal point of g on every target cell where g itself is illegal (deterministic)."""
    from evo.search.space import repair

    tdef = session.templates[g.template]
    out: list[Genome] = []
    for cell in session.cells:
        if tdef.is_valid(g.params_dict(), session.arch, cell.dtypes_dict(), cell.dims_dict()):
            continue
        p = repair(tdef, g.params_dict(), random.Random(0), session.arch, [cell.dtypes_dict()], [cell.dims_dict()])
        if p is not None:
            moved = Genome.make(g.op, g.template, g.source_hash, p)
            if moved.key() != g.key() and moved not in out:
                out.append(moved)
    return out


def _targets(cells: Sequence[Cell], sources: dict[str, tuple[str, dict]]) -> dict[str, list[str]]:
    """Per cell, the seeds predicted fastest there: those from the nearest champion cells of its dtypes."""
    out: dict[str, list[str]] = {}
    for cell in cells:
        here = Q.dtype_key(cell.dtypes_dict())
        near = [(round(dims_distance(cell.dims_dict(), dims), 9), k) for k, (dt, dims) in sources.items() if dt == here]
        if near:
            d = min(dist for dist, _ in near)
            out[cell.label()] = [k for dist, k in near if dist == d]
    return out


@dataclass(frozen=True)
class Screened:
    """The screen's split of a batch of proposals, with what it records."""

    keep: tuple[Genome, ...]
    rejected: tuple[Genome, ...]
    outcomes: tuple[Outcome, ...]  # REJECTED, for every rejected genome on every cell where it is legal
    rows: tuple[Row, ...]  # the rejected genomes' candidates, and the rejected/checked lesson uses


@dataclass
class Learner:
    """What a run takes from the store at its start, and what it gives back."""

    session: Session
    seeds: list[Genome] = field(default_factory=list)
    priors: dict | None = None
    predict: Callable[[str, dict], tuple[str, str] | None] | None = None
    targets: dict[str, list[str]] = field(default_factory=dict)  # cell -> keys of the seeds predicted fastest
    rejected: int = 0
    let_through: int = 0
    _seed_lessons: dict[str, str] = field(default_factory=dict)
    _seed_sources: dict[str, tuple[str, dict]] = field(default_factory=dict)  # key -> champion's (dtype, dims)
    _prior_sources: dict = field(default_factory=dict)
    table_seeds: str = ""  # what the seed tables gave, for the run's log ("" without tables)

    @classmethod
    def start(cls, session: Session, fresh: bool) -> "Learner":
        c = session.config.lessons
        s, op, arch = session.store, session.op.name, session.config.run.arch
        me = cls(session)
        if c.warm_start and fresh:
            k = max(1, session.config.search.population // 4)
            for seed in warm_start(s, op, arch, session.cells, k):
                tdef = session.templates.get(seed.template)
                if tdef is None or (seed.source_hash and seed.source_hash != tdef.source_hash):
                    continue
                params = dict(seed.params)
                if any(params.get(p) not in vals for p, vals in tdef.space) or set(params) != set(tdef.param_names):
                    continue  # outside this run's (possibly narrowed) space
                me._add_seed(Genome.make(op, tdef.name, tdef.source_hash, params), seed.lesson_id,
                             (seed.dtype, dict(seed.dims)))
            # A champion of a neighbouring shape may be illegal on the target cells (a CTA too wide
            # for a shorter row): carry it over by repairing it onto each target cell it misses.
            cap = max(1, session.config.search.population // 2)
            for g in list(me.seeds):
                for moved in _repaired_onto_cells(session, g):
                    if len(me.seeds) >= cap:
                        break
                    me._add_seed(moved, me._seed_lessons[g.key()], me._seed_sources[g.key()])
        paths = session.config.search.seed_tables
        if paths and fresh:
            from evo.loop.seed_tables import table_seeds

            got = table_seeds(paths, op, session.templates, {x.label(): x for x in session.cells})
            for t in got.seeds:
                if t.genome.key() not in me._seed_sources:
                    me.seeds.append(t.genome)
                    me._seed_sources[t.genome.key()] = t.source
            me.table_seeds = got.describe(paths)
        if c.warm_start and fresh and c.refine:
            me.targets = _targets(session.cells, me._seed_sources)
        if c.priors:
            space: dict = {name: dict(t.space) for name, t in session.templates.items()}
            space[Q.ANY_TEMPLATE] = {"template": sorted(session.templates)}  # the choice of template, too
            edges = session.op.bucket_edges
            me.priors = param_priors(s, op, arch, session.cells, space=space, edges=edges) or None
            me._prior_sources = prior_sources(s, op, arch, session.cells, edges=edges)
        if c.failure_memory:
            me.predict = failure_predictor(s, op, arch)
        return me

    def _add_seed(self, g: Genome, lesson_id: str, source: tuple[str, dict]) -> None:
        if g.key() not in self._seed_sources:
            self.seeds.append(g)
            self._seed_lessons[g.key()] = lesson_id
            self._seed_sources[g.key()] = source

    @property
    def champion_seeds(self) -> int:
        """Seeds that came from the store's champion lessons (not from seed tables)."""
        return len(self._seed_lessons)

    def seed_origin(self, key: str) -> str:
        """How a seed came: 'warm' (a champion lesson of the store) or 'table' (a seed table's entry)."""
        return "warm" if key in self._seed_lessons else "table"

    def seed_uses(self) -> list:
        return L.record_uses(self.session.run_id, L.Use.SEEDED, list(self._seed_lessons.items()))

    def screen(self, genomes: Sequence[Genome], rng: random.Random, generation: int) -> Screened:
        """Split proposals into (to evaluate, rejected) by failure memory; a few predicted failures are let
        through (and recorded as checks) to measure the rules' precision."""
        if self.predict is None:
            return Screened(tuple(genomes), (), (), ())
        keep, rejected, outcomes, rows = [], [], [], []
        for g in genomes:
            hit = self.predict(g.template, g.params_dict())
            if hit is None:
                keep.append(g)
                continue
            lesson_id, status = hit
            if rng.random() < LET_THROUGH:
                self.let_through += 1
                keep.append(g)
                rows += L.record_uses(self.session.run_id, L.Use.CHECKED, [(g.key(), lesson_id)])
                continue
            self.rejected += 1
            rejected.append(g)
            rows += L.record_uses(self.session.run_id, L.Use.REJECTED, [(g.key(), lesson_id)])
            rows.append(CandidateRow(genome_key=g.key(), op=g.op, template=g.template, source_hash=g.source_hash,
                                     params_json=g.params_json(), origin="search", parents_json="[]",
                                     run_id=self.session.run_id, generation=generation))
            outcomes += self._rejections(g, f"predicted {status} by lesson {lesson_id}")
        return Screened(tuple(keep), tuple(rejected), tuple(outcomes), tuple(rows))

    def _rejections(self, g: Genome, why: str) -> list[Outcome]:
        ses = self.session
        tdef = ses.templates[g.template]
        return [Outcome(g, cell, Status.REJECTED, error=why) for cell in ses.cells
                if tdef.is_valid(g.params_dict(), ses.arch, cell.dtypes_dict(), cell.dims_dict())]

    def credit(self, gen: Generation, cells_for: Callable[[Genome], frozenset[str] | None]) -> list[Row]:
        """The lesson uses a generation earned: priors that biased its bred genomes, refinements it polled."""
        return self.bias_uses(gen.bred()) + self.refine_uses(gen.genomes, cells_for)

    def bias_uses(self, genomes: Sequence[Genome]) -> list:
        """Bred genomes whose template or values a prior favoured (weight above average) credit its lessons."""
        if not self.priors:
            return []
        uses = []
        for g in genomes:
            if self.priors.get(Q.ANY_TEMPLATE, {}).get("template", {}).get(g.template, 0.0) > 1.0:
                uses += [(g.key(), lid) for lid in self._prior_sources.get(Q.ANY_TEMPLATE, {}).get("template", [])]
            for p, v in g.params:
                w = self.priors.get(g.template, {}).get(p, {})
                if w and w.get(v, 0.0) > 1.0:
                    uses += [(g.key(), lid) for lid in self._prior_sources.get(g.template, {}).get(p, [])]
        return L.record_uses(self.session.run_id, L.Use.BIASED, uses)

    def refine_uses(self, genomes: Sequence[Genome], cells_for: Callable[[Genome], frozenset[str] | None]) -> list:
        """Neighbours polled where a prediction missed credit the lessons behind the seeds that missed (a seed
        from a dispatch table has no lesson: nothing to credit)."""
        uses = []
        for g in genomes:
            for label in sorted(cells_for(g) or ()):
                uses += [(g.key(), self._seed_lessons[k]) for k in self.targets.get(label, []) if k in self._seed_lessons]
        return L.record_uses(self.session.run_id, L.Use.REFINED, uses)

    def refresh(self, final: bool = False) -> int:
        """Re-extract lessons from the whole store; at the end also settle usefulness."""
        ses = self.session
        rows = L.refresh_lessons(ses.store, ses.op.name, ses.config.run.arch, ses.run_id, edges=ses.op.bucket_edges)
        if final:
            L.update_usefulness(ses.store, ses.run_id)
        return len(rows)

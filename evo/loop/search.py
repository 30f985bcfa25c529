"""The search loop: propose -> screen -> build -> measure -> record -> learn, within budgets, resumable.

The stages compute and return records (a Generation); the side effects hang off the loop as Callbacks:
crediting lessons, recording the generation (one writer, one transaction), showing progress,
re-extracting lessons, and at the end the dispatch table.

Resume: a generation lands in the store whole or not at all, so after a kill the store holds whole
generations. A run started again with the same run id rebuilds the strategy from its stored
observations (the strategy is deterministic given seed + observation history) and evaluates nothing
that is already recorded.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from evo.build.nvrtc import Builder, BuildResult
from evo.core.config import Backend, Config, ConfigError, Runner, StrategyKind
from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.loop.build_summary import BuildSummary
from evo.loop.generation import Callbacks, Generation
from evo.loop.learn import REFRESH_EVERY, Learner, Screened
from evo.loop.pipeline import Session, build, dtype_sets
from evo.loop.record import Recorder, fingerprint_class
from evo.measure.evaluators import EvalItem, Evaluator, GpuEvaluator, ReplayEvaluator
from evo.measure.jobs import Timing
from evo.search.strategy import GeneticSearch, Observation, RandomSearch
from memory.queries import counts_text, gpu_pace, run_builds, run_totals
from memory.results import ok_results, recorded_outcomes, reusable_results
from memory.rows import Row
from memory.runs import elapsed_s, next_generation, reused_count
from memory.sources import llm_sources
from evo.core.spec import Cell


@dataclass
class Progress:
    """The loop's own state across generations (what the budgets and the LLM stage read)."""

    generation: int = 0
    evaluated: int = 0  # (genome, cell) evaluations, failures included
    statuses: Counter[str] = field(default_factory=Counter)  # of them, by Status name (the report's words)
    reused: int = 0  # of them, results copied from another run's measurement (same fingerprint class)
    best: dict[str, tuple[str, float, float]] = field(default_factory=dict)  # cell -> (genome key, us, baseline)
    stale: int = 0
    started: float = field(default_factory=lambda: time.monotonic())  # moved back by the time spent before a resume
    genomes: int = 0  # genomes measured in this process's generations (the pace that sizes the last one)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def geomean_speedup(self) -> float:
        v = [b / t for _, t, b in self.best.values() if math.isfinite(b) and t > 0]
        return float(np.exp(np.mean(np.log(v)))) if v else 0.0


SearchStrategy = GeneticSearch | RandomSearch


def make_strategy(session: Session, seeds: Sequence[Genome] = (), priors: dict | None = None,
                  targets: dict | None = None) -> SearchStrategy:
    c = session.config
    rng = random.Random(c.run.seed)
    ds = dtype_sets(session.cells)
    if c.search.strategy is StrategyKind.RANDOM:
        return RandomSearch(session.templates, rng, session.arch, ds, session.cells)
    s = c.search
    return GeneticSearch(session.templates, rng, session.arch, ds, session.cells, population=s.population,
                         elite=s.elite, tournament=s.tournament, p_crossover=s.p_crossover, p_switch=s.p_switch,
                         max_template_share=s.max_template_share, seeds=seeds, priors=priors, targets=targets)


def observations(session: Session, outcomes: Sequence[Outcome], genomes: Sequence[Genome]) -> list[Observation]:
    """One Observation per genome: its time on every cell (inf where illegal or failed)."""
    times: dict[str, dict[str, float]] = {g.key(): {c.label(): math.inf for c in session.cells} for g in genomes}
    for o in outcomes:
        if o.status is Status.OK:
            times[o.genome.key()][o.cell.label()] = o.median_us
    return [Observation(g, times[g.key()]) for g in genomes]


def load_llm_templates(session: Session) -> list:
    """LLM-written templates this run already used (so a resumed run can rebuild their genomes)."""
    from evo.templates.template import TemplateError, parse_template

    out = []
    for source_hash, text in llm_sources(session.store, session.run_id):
        try:
            t = parse_template(text, f"source {source_hash[:12]}")
        except TemplateError:
            continue  # recorded but never applicable; the LLM_ERROR is in llm_calls
        session.templates.setdefault(t.name, t)
        out.append(t)
    return out


def _stored_outcome(g: Genome, cell: Cell, r: Any, reused_from: str = "") -> Outcome:
    return Outcome(g, cell, Status(r.status), r.build_key if isinstance(r.build_key, str) else "",
                   r.error if isinstance(r.error, str) else "",
                   median_us=_f(r.median_us), p10_us=_f(r.p10_us), p90_us=_f(r.p90_us), samples=0 if pd.isna(r.samples) else int(r.samples),
                   baseline_us=_f(r.baseline_us), reused_from=reused_from)


def stored_history(session: Session) -> tuple[list[Observation], list[Outcome]]:
    """This run's recorded evaluations, as observations in generation order (for resume)."""
    df = recorded_outcomes(session.store, session.run_id)
    if df.empty:
        return [], []
    by_label = {c.label(): c for c in session.cells}
    genomes: dict[str, Genome] = {}
    outcomes = []
    for r in df.itertuples(index=False):
        t = session.templates.get(r.template)
        if t is None or r.cell not in by_label:
            continue
        g = genomes.setdefault(r.genome_key, Genome.make(session.op.name, r.template, t.source_hash,
                                                         json.loads(r.params_json)))
        outcomes.append(_stored_outcome(g, by_label[r.cell], r))
    return observations(session, outcomes, list(genomes.values())), outcomes


def stored_builds_summary(session: Session) -> BuildSummary:
    """The builds this run's recorded evaluations used (for resume), in the order the run first used them."""
    df = run_builds(session.store, session.run_id)
    return BuildSummary().add([(r.template, BuildResult(r.build_key, Status(r.status),
                                                        error=r.error if isinstance(r.error, str) else ""))
                               for r in df.itertuples(index=False)])


def reusable(session: Session, evaluator: Evaluator) -> dict[tuple[str, str, str], Outcome]:
    """Results other runs measured under the same fingerprint class and source (reused_from names the run
    that measured each): never measured twice. Search.measure reuses one only for the same build key (the same
    rendered source, compiler and specialization)."""
    df = reusable_results(session.store, fingerprint_class(evaluator.fingerprint), evaluator.source, session.run_id)
    by_label = {c.label(): c for c in session.cells}
    out: dict[tuple[str, str, str], Outcome] = {}
    for r in df.itertuples(index=False):
        t = session.templates.get(r.template)
        key = (r.genome_key, r.cell, r.build_key if isinstance(r.build_key, str) else "")
        if t is None or r.cell not in by_label or key in out:
            continue
        g = Genome.make(session.op.name, r.template, t.source_hash, json.loads(r.params_json))
        if g.key() != r.genome_key:
            continue  # another version of the template text
        out[key] = _stored_outcome(g, by_label[r.cell], r, r.measured_in)
    return out


def _f(x: Any) -> float:
    return math.inf if x is None or pd.isna(x) else float(x)


def update_progress(p: Progress, outcomes: Sequence[Outcome]) -> bool:
    """Fold a batch into the progress; True when some cell's best improved."""
    improved = False
    for o in outcomes:
        p.evaluated += 1
        p.statuses[o.status.value] += 1
        if o.status is not Status.OK:
            continue
        label = o.cell.label()
        cur = p.best.get(label)
        if cur is None or o.median_us < cur[1]:
            p.best[label] = (o.genome.key(), o.median_us, o.baseline_us)
            improved = True
    return improved


def replay_evaluator(session: Session) -> ReplayEvaluator:
    """The replay data of a replay run, refused (ConfigError) unless it covers every cell of the run."""
    path = session.config.run.replay_data
    try:
        ev = ReplayEvaluator(path)
    except FileNotFoundError:
        raise ConfigError(f"run.replay_data: file not found: {path}") from None
    except (ValueError, OSError) as e:  # not Parquet, or lacks columns
        raise ConfigError(f"run.replay_data: cannot use {path}: {e}") from None
    covered = set(ev.best_per_cell())
    missing = [c.label() for c in session.cells if c.label() not in covered]
    if missing:
        raise ConfigError(f"cells: the replay data {path} has no OK measurement for {len(missing)} of the "
                          f"{len(session.cells)} cells: {', '.join(missing)}; narrow [cells] to cells it covers")
    return ev


def run_search(session: Session, evaluator: Evaluator | None = None) -> int:
    """Run (or resume) the configured search; writes dispatch.json beside the store."""
    c = session.config
    if c.run.backend is not Backend.RAY:
        return _run_search(session, evaluator)
    from evo.measure.ray_backend import init_ray, shutdown_ray

    init_ray(c.run.ray_address)
    try:
        return _run_search(session, evaluator)
    finally:
        shutdown_ray()


def _run_search(session: Session, evaluator: Evaluator | None = None) -> int:
    c = session.config
    if c.run.runner is Runner.REPLAY:
        return _loop(session, evaluator or replay_evaluator(session))
    with make_runner(c) as runner:
        timing = Timing(min_samples=c.eval.min_samples, max_samples=c.eval.max_samples, warmup=c.eval.warmup)
        return _loop(session, GpuEvaluator(session.op, session.arch, runner, timing, c.run.seed,
                                           baseline=c.eval.baseline))


def make_builder(c: Config) -> Any:
    """A process pool here, or Ray CPU tasks (the caller has called init_ray)."""
    if c.run.backend is Backend.RAY:
        from evo.measure.ray_backend import RayBuilder

        return RayBuilder(timeout_s=c.build.timeout_s)
    return Builder(c.build.workers, timeout_s=c.build.timeout_s)


def make_runner(c: Config) -> Any:
    """One worker process per visible GPU here, or one Ray actor per GPU of the cluster."""
    if c.run.backend is Backend.RAY:
        from evo.measure.ray_backend import RayRunner

        return RayRunner(timeout_s=c.eval.timeout_s)
    from evo.measure.run import GpuRunner, visible_devices

    return GpuRunner(devices=visible_devices(), timeout_s=c.eval.timeout_s)


class Search:
    """A run's generations. Each is propose -> screen -> build -> measure (`generation`), then the
    callbacks credit and record it, the loop learns from it (`learn`), and the rest of the callbacks run."""

    def __init__(self, session: Session, evaluator: Evaluator, strategy: SearchStrategy, learner: Learner,
                 llm: Any, progress: Progress, reuse: dict[tuple[str, str, str], Outcome]) -> None:
        self.session, self.evaluator, self.strategy, self.learner, self.llm = session, evaluator, strategy, learner, llm
        self.progress, self.reuse = progress, reuse
        self.done = session.store.evaluated_keys(session.run_id)  # (genome key, cell) pairs this run recorded
        seed = session.config.run.seed
        self.llm_rng, self.screen_rng = random.Random(seed + 7), random.Random(seed + 11)

    def run(self, callbacks: Callbacks) -> str:
        """Generations until a budget is spent or the space is exhausted; returns why it stopped."""
        with make_builder(self.session.config) as builder:
            while not (stop := _budget_exhausted(self.session.config, self.progress)):
                gen = self.generation(builder)
                callbacks.record(gen, callbacks.credit(gen))  # an empty one still records what the LLM was asked
                if gen.empty:
                    return "search space exhausted"
                self.learn(gen)
                for after in callbacks.after:
                    after(gen)
                self.progress.generation += 1
            return stop

    def generation(self, builder: Any) -> Generation:
        """One generation's stages, propose -> screen -> build -> measure; nothing is written here."""
        n = self.progress.generation
        screened = self.screen(self.propose(), n)
        genomes = list(screened.keep)
        origins = {g.key(): "init" if n == 0 else "search" for g in genomes}
        origins.update({g.key(): self.learner.seed_origin(g.key()) for g in self.learner.seeds if g.key() in origins})
        kids, parents, llm_rows = self.llm_children()
        genomes += [g for g in kids if g.key() not in origins]
        origins.update({g.key(): "llm" for g in kids})
        if not genomes and not screened.rejected:
            return Generation(n, (), origins, (), (), (), tuple(llm_rows), self.progress.elapsed)
        built = build(self.session, builder, genomes, n, origins, parents)
        outcomes = self.measure(genomes, built.cells)
        return Generation(n, tuple(genomes), origins, screened.rejected, tuple(outcomes), screened.outcomes,
                          (*llm_rows, *built.rows, *screened.rows), self.progress.elapsed)

    def propose(self) -> list[Genome]:
        """The strategy's next genomes, less those this run already evaluated."""
        c = self.session.config
        p = self.progress
        want = min(c.search.population, max(1, c.budget.max_evals - p.evaluated))
        prior = self._prior_genome_s() if p.genomes <= 0 else None
        want = fit_in_time(want, c.budget.max_seconds - p.elapsed, p.elapsed, p.genomes, prior)
        return [g for g in self.strategy.propose(want) if not self._evaluated(g)]

    def _prior_genome_s(self) -> float | None:
        """Before this run has a pace of its own: a genome's seconds at the pace of this op's recent GPU runs on
        this arch (their time over their measured evaluations), times this run's cells; None without such runs."""
        s = self.session
        pace = gpu_pace(s.store, s.op.name, s.config.run.arch, s.run_id)
        return None if pace is None else pace * len(s.cells)

    def screen(self, genomes: Sequence[Genome], generation: int) -> Screened:
        """Failure memory; the strategy hears of the rejected at once (never built: inf everywhere)."""
        screened = self.learner.screen(genomes, self.screen_rng, generation)
        if screened.rejected:
            self.strategy.observe(observations(self.session, [], screened.rejected))
        return screened

    def llm_children(self) -> tuple[list[Genome], dict[str, str], list[Row]]:
        """The LLM operator's new genomes (none without a model), child -> parent keys, and their rows."""
        if self.llm is None:
            return [], {}, []
        from evo.loop.llm_step import llm_children

        kids, parents, rows = llm_children(self.session, self.strategy, self.llm, self.progress.best, self.llm_rng,
                                           self.evaluator.ceiling_gbps)
        # an answer seen before gives the same template and genome: never evaluate it twice
        kids = [g for g in kids if self.strategy.genome(g.key()) is None and not self._evaluated(g)]
        return kids, parents, rows

    def measure(self, genomes: Sequence[Genome], built: dict[str, list[tuple[Cell, BuildResult]]]) -> list[Outcome]:
        """Every built (genome, cell) the strategy wants measured (cells_for): reused where another run
        measured the same build (its key) on it under the same fingerprint class, else evaluated."""
        by_key = {g.key(): g for g in genomes}
        only = {k: self.strategy.cells_for(g) for k, g in by_key.items()}  # None: every legal cell
        items = [EvalItem(by_key[k], self.session.templates[by_key[k].template], cell, b)
                 for k, pairs in built.items() for cell, b in pairs
                 if only[k] is None or cell.label() in only[k]]

        def reused(it: EvalItem) -> Outcome | None:
            if not it.build.status.ok:  # a build this run refuses (build.max_spill_bytes): not another run's time
                return None
            return self.reuse.get((it.genome.key(), it.cell.label(), it.build.build_key))

        old = {(it.genome.key(), it.cell.label()): o for it in items if (o := reused(it)) is not None}
        outcomes = list(old.values())
        return outcomes + self.evaluator.evaluate([it for it in items
                                                   if (it.genome.key(), it.cell.label()) not in old])

    def learn(self, gen: Generation) -> None:
        """The strategy observes the generation; the loop's progress and evaluated pairs take it in."""
        self.progress.reused += sum(bool(o.reused_from) for o in gen.outcomes)
        self.progress.genomes += len(gen.genomes)
        self.strategy.observe(observations(self.session, gen.outcomes, gen.genomes))
        self.done |= {o.pair() for o in gen.outcomes}
        improved = update_progress(self.progress, gen.outcomes)
        self.progress.stale = 0 if improved else self.progress.stale + 1

    def _evaluated(self, g: Genome) -> bool:
        return any((g.key(), x.label()) in self.done for x in self.session.cells)


def _loop(session: Session, evaluator: Evaluator) -> int:
    llm_tdefs = load_llm_templates(session)
    history, past = stored_history(session)
    learner = Learner.start(session, fresh=not history)
    strategy = make_strategy(session, learner.seeds, learner.priors, learner.targets)
    if learner.seeds:
        session.store.write(learner.seed_uses())
        if learner.champion_seeds:
            session.log(f"warm start: {learner.champion_seeds} seeds from champions in the store")
    if learner.table_seeds:
        session.log(learner.table_seeds)
    for t in llm_tdefs:
        strategy.add_template(t)
    llm = None
    if session.config.llm.model != "none" or session.config.llm.replay_run:
        from evo.loop.llm_step import make_session_llm

        llm = make_session_llm(session)
    progress = Progress()
    spent = elapsed_s(session.store, session.run_id)
    if spent is not None and math.isfinite(spent):
        progress.started -= spent  # a resumed run keeps what is left of budget.max_seconds
    if history:
        strategy.replay(history)
        # a REJECTED row was never run: the first run's progress did not count it either
        update_progress(progress, [o for o in past if o.status is not Status.REJECTED])
        progress.generation = next_generation(session.store, session.run_id)
        session.log(f"resumed {session.run_id}: {len(history)} genomes, {len(past)} evaluations already recorded")
    reuse = reusable(session, evaluator)
    progress.reused = reused_count(session.store, session.run_id)
    search = Search(session, evaluator, strategy, learner, llm, progress, reuse)
    callbacks = Callbacks(
        credit=lambda gen: learner.credit(gen, strategy.cells_for),
        record=Recorder(session, evaluator.fingerprint, evaluator.ceiling_gbps, evaluator.source),
        after=(_show_progress(session, progress, learner), _extract_lessons(learner), _snapshot(session),
               lambda gen: write_dispatch(session, progress, reuse)),  # a run killed later still leaves its table
        dispatch=_finish(session, learner, progress, reuse))
    stop = ""
    try:
        stop = search.run(callbacks)
    finally:  # also when interrupted: a resume continues with the time that is left
        session.store.record_elapsed(session.run_id, progress.elapsed)
    callbacks.dispatch(stop)
    return 0


def _show_progress(session: Session, progress: Progress, learner: Learner) -> Callable[[Generation], None]:
    """One line per generation, through rich (plain text when stdout is not a terminal)."""
    show = session.log
    if show is print:
        from rich.console import Console

        console = Console(highlight=False, soft_wrap=True)
        show = console.print
    c = session.config

    def progress_line(gen: Generation) -> None:
        show(_line(progress, c) + (f"  rejected {learner.rejected}" if learner.predict else ""))

    return progress_line


def _extract_lessons(learner: Learner) -> Callable[[Generation], None]:
    def extract(gen: Generation) -> None:
        if (gen.number + 1) % REFRESH_EVERY == 0:
            learner.refresh()

    return extract


def _snapshot(session: Session) -> Callable[[Generation], None]:
    def snapshot(gen: Generation) -> None:
        session.store.write_snapshot()  # what `kfactory sql/report/lessons` read while this run holds the store

    return snapshot


def _finish(session: Session, learner: Learner, progress: Progress,
            reuse: dict[tuple[str, str, str], Outcome]) -> Callable[[str], None]:
    def finish(stop: str) -> None:
        dispatch, from_store = write_dispatch(session, progress, reuse)
        n_lessons = learner.refresh(final=True)
        session.log(f"lessons: {n_lessons} re-derived from the store; failure memory rejected {learner.rejected} "
                    f"candidates and let {learner.let_through} predicted failures through to check the rules")
        # counted from the store, as `kfactory report` counts them and in its words, so the two never disagree
        # (this process's own tallies counted build inputs, some for cells never evaluated: 1584 against 1272)
        totals = run_totals(session.store, session.run_id)
        session.log(f"evaluations: {totals.evaluations_text()}; by status: {counts_text(totals.statuses)}")
        session.log(f"builds: {totals.builds_text()}")
        kept = f" ({from_store} from earlier runs' measurements, faster than this run's)" if from_store else ""
        session.log(f"stopped: {stop}; geomean speedup: {totals.geomean_text()}; dispatch table {dispatch}{kept}")
        builds = stored_builds_summary(session)  # the same builds, by status, with their first errors
        for line in builds.lines():
            session.log(line)
        builds.check()  # nothing built OK: an error, and run_config records the run as failed
        session.store.finish_run(session.run_id, "done", stop)

    return finish


def fit_in_time(want: int, left_s: float, spent_s: float, genomes: int, prior_genome_s: float | None = None) -> int:
    """How many of `want` genomes a generation can take in the `left_s` seconds of budget.max_seconds,
    at this run's pace so far (spent_s over the genomes its generations measured, builds included); before the
    run has a pace, at `prior_genome_s` a genome where given (gpu_pace: so a first generation fits the budget; a
    16-genome first generation of 36 serving cells once took longer than its whole 100 s), else all of them; never
    fewer than one. The budget is checked between generations, so without this the last generation overran it by
    up to a whole generation (50 s of a 180 s run)."""
    if want <= 0 or not math.isfinite(left_s):
        return want
    if genomes <= 0 or spent_s <= 0:
        if prior_genome_s is None or not prior_genome_s > 0:
            return want
        return max(1, min(want, int(left_s / prior_genome_s)))
    return max(1, min(want, int(left_s / (spent_s / genomes))))


def _budget_exhausted(c: Config, p: Progress) -> str:
    if p.evaluated >= c.budget.max_evals:
        return f"budget.max_evals ({c.budget.max_evals}) reached"
    if p.generation >= c.budget.generations:
        return f"budget.generations ({c.budget.generations}) reached"
    if time.monotonic() - p.started >= c.budget.max_seconds:
        return f"budget.max_seconds ({c.budget.max_seconds:.0f}) reached"
    if p.stale >= c.budget.patience:
        return f"no improvement for {p.stale} generations (budget.patience)"
    return ""


def _line(p: Progress, c: Config) -> str:
    left = c.budget.max_seconds - (time.monotonic() - p.started)
    return (f"gen {p.generation:3d}  evaluated {p.evaluated:5d} ({counts_text(p.statuses)})  cells with a best "
            f"{len(p.best):3d}  geomean speedup {p.geomean_speedup():6.3f}  time left {left:6.0f} s")


def write_dispatch(session: Session, p: Progress, reuse: dict[tuple[str, str, str], Outcome] | None = None
                   ) -> tuple[Path, int]:
    """shape -> genome table (best per cell), plus the single genome with the best geomean.

    The table weighs this run's OK results together with the results it could reuse (other runs'
    measurements under the same fingerprint class and source), so a rerun never ends with a worse
    kernel for a cell than the store already held; returns the file and how many cells came from those.
    Such a measurement may be of an earlier rendering (an include edited since): `kfactory export` rebuilds
    each entry and refuses one whose cubin is no longer the one measured.
    """
    df = ok_results(session.store, session.run_id)
    ours = set(zip(df.genome_key, df.cell))
    extra = pd.DataFrame([{"genome_key": key, "cell": cell, "median_us": o.median_us,
                           "baseline_us": o.baseline_us, "template": o.genome.template,
                           "params_json": o.genome.params_json(), "measured_in": o.reused_from}
                          for (key, cell, _build), o in (reuse or {}).items()
                          if (key, cell) not in ours and o.timed], columns=df.columns)
    df = pd.concat([df, extra], ignore_index=True) if not extra.empty else df
    table, from_store = {}, 0
    for cell, grp in df.groupby("cell"):
        r = grp.sort_values(["median_us", "genome_key"], kind="stable").iloc[0]
        from_store += (r.genome_key, cell) not in ours
        table[cell] = {"genome_key": r.genome_key, "template": r.template, "params": json.loads(r.params_json),
                       "median_us": float(r.median_us), "measured_in": r.measured_in,
                       "speedup_vs_torch": float(r.baseline_us / r.median_us) if r.baseline_us == r.baseline_us
                       and math.isfinite(r.baseline_us) else None}
    best_single = None
    if not df.empty:
        n_cells = df.cell.nunique()
        best = df.groupby("cell").median_us.transform("min")
        df = df.assign(rel=best / df.median_us)
        full = df.groupby("genome_key").filter(lambda g: len(g) == n_cells)
        if not full.empty:
            gm = full.groupby("genome_key").rel.apply(lambda s: float(np.exp(np.mean(np.log(s))))).sort_values()
            key = gm.index[-1]
            row = full[full.genome_key == key].iloc[0]
            best_single = {"genome_key": key, "template": row.template, "params": json.loads(row.params_json),
                           "geomean_vs_best_per_cell": float(gm.iloc[-1])}
    out = session.store.path.parent / "runs" / session.run_id / "dispatch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"run_id": session.run_id, "dispatch": table, "best_single_genome": best_single},
                              indent=2, sort_keys=True))
    return out, from_store

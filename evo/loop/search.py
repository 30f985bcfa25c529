"""The search loop: propose -> build -> evaluate -> record -> observe, within budgets, resumable.

Resume: every batch lands in the store in one transaction, so after a kill the store holds whole
generations. A run started again with the same run id rebuilds the strategy from its stored
observations (the strategy is deterministic given seed + observation history) and evaluates nothing
that is already recorded.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from evo.build.nvrtc import Builder
from evo.core.config import Backend, ConfigError, Runner, StrategyKind
from evo.measure.evaluators import CellEval, EvalItem, GpuEvaluator, ReplayEvaluator
from evo.core.genome import Genome
from evo.measure.jobs import Timing
from evo.loop.learn import REFRESH_EVERY, Learner
from evo.loop.pipeline import Session, dtype_sets
from evo.core.status import Status
from evo.search.strategy import GeneticSearch, Observation, RandomSearch


@dataclass
class Progress:
    generation: int = 0
    evaluated: int = 0  # (genome, cell) evaluations, failures included
    failed: int = 0
    reused: int = 0  # of them, results copied from another run's measurement (same fingerprint class)
    best: dict[str, tuple[str, float, float]] = field(default_factory=dict)  # cell -> (genome key, us, baseline)
    stale: int = 0
    started: float = field(default_factory=time.monotonic)  # moved back by the time spent before a resume

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def geomean_speedup(self) -> float:
        v = [b / t for _, t, b in self.best.values() if math.isfinite(b) and t > 0]
        return float(np.exp(np.mean(np.log(v)))) if v else 0.0


def make_strategy(session: Session, seeds: Sequence[Genome] = (), priors: dict | None = None,
                  targets: dict | None = None) -> Any:
    c = session.config
    rng = random.Random(c.run.seed)
    ds = dtype_sets(session.cells)
    if c.search.strategy is StrategyKind.RANDOM:
        return RandomSearch(session.templates, rng, session.arch, ds, session.cells)
    s = c.search
    return GeneticSearch(session.templates, rng, session.arch, ds, session.cells, population=s.population,
                         elite=s.elite, tournament=s.tournament, p_crossover=s.p_crossover, p_switch=s.p_switch,
                         max_template_share=s.max_template_share, seeds=seeds, priors=priors, targets=targets)


def observations(session: Session, evals: Sequence[CellEval], genomes: Sequence[Genome]) -> list[Observation]:
    """One Observation per genome: its time on every cell (inf where illegal or failed)."""
    times: dict[str, dict[str, float]] = {g.key(): {c.label(): math.inf for c in session.cells} for g in genomes}
    for ev in evals:
        if ev.status is Status.OK:
            times[ev.genome.key()][ev.cell.label()] = ev.median_us
    return [Observation(g, times[g.key()]) for g in genomes]


def load_llm_templates(session: Session) -> list:
    """LLM-written templates this run already used (so a resumed run can rebuild their genomes)."""
    from evo.templates.template import TemplateError, parse_template

    df = session.store.sql(
        "SELECT DISTINCT s.source_hash, s.text FROM sources s JOIN candidates c USING (source_hash) "
        "WHERE s.origin = 'llm' AND c.run_id = ?", [session.run_id])
    out = []
    for r in df.itertuples(index=False):
        try:
            t = parse_template(r.text, f"source {r.source_hash[:12]}")
        except TemplateError:
            continue  # recorded but never applicable; the LLM_ERROR is in llm_calls
        session.templates.setdefault(t.name, t)
        out.append(t)
    return out


def stored_history(session: Session) -> tuple[list[Observation], list[CellEval]]:
    """This run's recorded evaluations, as observations in generation order (for resume)."""
    df = session.store.sql(
        "SELECT e.genome_key, e.cell, e.status, e.median_us, e.baseline_us, e.generation, c.template, c.params_json "
        "FROM evaluations e JOIN candidates c USING (genome_key) WHERE e.run_id = ? ORDER BY e.generation, e.created_at",
        [session.run_id])
    if df.empty:
        return [], []
    by_label = {c.label(): c for c in session.cells}
    genomes: dict[str, Genome] = {}
    evals = []
    for r in df.itertuples(index=False):
        t = session.templates.get(r.template)
        if t is None or r.cell not in by_label:
            continue
        g = genomes.setdefault(r.genome_key, Genome.make(session.op.name, r.template, t.source_hash,
                                                         json.loads(r.params_json)))
        evals.append(CellEval(g, by_label[r.cell], Status(r.status), median_us=_f(r.median_us),
                              baseline_us=_f(r.baseline_us)))
    return observations(session, evals, list(genomes.values())), evals


def _f(x: Any) -> float:
    return float(x) if x is not None and x == x else math.inf


def update_progress(p: Progress, evals: Sequence[CellEval]) -> bool:
    """Fold a batch into the progress; True when some cell's best improved."""
    improved = False
    for ev in evals:
        p.evaluated += 1
        if ev.status is not Status.OK:
            p.failed += 1
            continue
        label = ev.cell.label()
        cur = p.best.get(label)
        if cur is None or ev.median_us < cur[1]:
            p.best[label] = (ev.genome.key(), ev.median_us, ev.baseline_us)
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


def run_search(session: Session, evaluator: Any = None) -> int:
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


def _run_search(session: Session, evaluator: Any = None) -> int:
    c = session.config
    if c.run.runner is Runner.REPLAY:
        return _loop(session, evaluator or replay_evaluator(session))
    with make_runner(c) as runner:
        timing = Timing(min_samples=c.eval.min_samples, max_samples=c.eval.max_samples, warmup=c.eval.warmup)
        return _loop(session, GpuEvaluator(session.op, session.arch, runner, timing, c.run.seed))


def make_builder(c: Any) -> Any:
    """A process pool here, or Ray CPU tasks (the caller has called init_ray)."""
    if c.run.backend is Backend.RAY:
        from evo.measure.ray_backend import RayBuilder

        return RayBuilder(timeout_s=c.build.timeout_s)
    return Builder(c.build.workers, timeout_s=c.build.timeout_s)


def make_runner(c: Any) -> Any:
    """One worker process per visible GPU here, or one Ray actor per GPU of the cluster."""
    if c.run.backend is Backend.RAY:
        from evo.measure.ray_backend import RayRunner

        return RayRunner(timeout_s=c.eval.timeout_s)
    from evo.measure.run import GpuRunner, visible_devices

    return GpuRunner(devices=visible_devices(), timeout_s=c.eval.timeout_s)


def _loop(session: Session, evaluator: Any) -> int:
    show = _display(session)
    llm_tdefs = load_llm_templates(session)
    history, past = stored_history(session)
    learner = Learner.start(session, fresh=not history)
    strategy = make_strategy(session, learner.seeds, learner.priors, learner.targets)
    if learner.seeds:
        session.store.write(learner.seed_uses())
        session.log(f"warm start: {len(learner.seeds)} seeds from champions in the store")
    for t in llm_tdefs:
        strategy.add_template(t)
    llm = None
    if session.config.llm.model != "none" or session.config.llm.replay_run:
        from evo.loop.llm_step import make_session_llm

        llm = make_session_llm(session)
    progress = Progress()
    spent = session.store.sql("SELECT elapsed_s FROM runs WHERE run_id = ?", [session.run_id]).elapsed_s
    if not spent.empty and math.isfinite(_f(spent[0])):
        progress.started -= _f(spent[0])  # a resumed run keeps what is left of budget.max_seconds
    if history:
        strategy.replay(history)
        update_progress(progress, past)
        progress.generation = int(session.store.sql(
            "SELECT coalesce(max(generation), -1) + 1 AS g FROM evaluations WHERE run_id = ?", [session.run_id]).g[0])
        session.log(f"resumed {session.run_id}: {len(history)} genomes, {len(past)} evaluations already recorded")
    done = session.store.evaluated_keys(session.run_id)
    reuse = reusable(session, evaluator)
    progress.reused = int(session.store.sql("SELECT count(reused_from) AS n FROM evaluations WHERE run_id = ?",
                                            [session.run_id]).n[0])
    stop = ""
    try:
        stop = _generations(session, evaluator, strategy, learner, llm, progress, done, reuse, show)
    finally:  # also when interrupted: a resume continues with the time that is left
        session.store.record_elapsed(session.run_id, progress.elapsed)
    dispatch, from_store = write_dispatch(session, progress, reuse)
    n_lessons = learner.refresh(final=True)
    session.store.finish_run(session.run_id, "done", stop)
    session.log(f"lessons: {n_lessons} re-derived from the store; failure memory rejected {learner.rejected} "
                f"candidates and let {learner.let_through} predicted failures through to check the rules")
    session.log(f"evaluations: {progress.evaluated - progress.reused} measured, {progress.reused} reused from "
                f"earlier runs; builds: {session.builds_compiled} compiled, {session.builds_reused} reused from "
                "the store")
    kept = f" ({from_store} from earlier runs' measurements, faster than this run's)" if from_store else ""
    session.log(f"stopped: {stop}; best per cell over {len(progress.best)} cells, geomean speedup vs torch "
                f"{progress.geomean_speedup():.3f}; dispatch table {dispatch}{kept}")
    return 0


def _generations(session: Session, evaluator: Any, strategy: Any, learner: Learner, llm: Any, progress: Progress,
                 done: set[tuple[str, str]], reuse: dict[tuple[str, str], Reused], show: Any) -> str:
    """Generations until a budget is spent or the space is exhausted; returns why it stopped."""
    c = session.config
    llm_rng = random.Random(c.run.seed + 7)
    screen_rng = random.Random(c.run.seed + 11)
    with make_builder(c) as builder:
        while True:
            stop = _budget_exhausted(c, progress)
            if stop:
                return stop
            want = min(c.search.population, max(1, c.budget.max_evals - progress.evaluated))
            genomes = [g for g in strategy.propose(want) if not any((g.key(), x.label()) in done for x in session.cells)]
            genomes, rejected, lesson_rows = learner.screen(genomes, screen_rng, progress.generation,
                                                             evaluator.fingerprint, evaluator.source)
            if rejected:
                strategy.observe(observations(session, [], rejected))
            origins: dict[str, str] = {g.key(): "init" if progress.generation == 0 else "search" for g in genomes}
            origins.update({g.key(): "warm" for g in learner.seeds if g.key() in origins})
            parents: dict[str, str] = {}
            if llm is not None:
                from evo.loop.llm_step import llm_children

                kids, parents = llm_children(session, strategy, llm, progress.best, llm_rng, evaluator.ceiling_gbps)
                # an answer seen before gives the same template and genome: never evaluate it twice
                kids = [g for g in kids if strategy.genome(g.key()) is None
                        and not any((g.key(), x.label()) in done for x in session.cells)]
                genomes += [g for g in kids if g.key() not in origins]
                origins.update({g.key(): "llm" for g in kids})
            if not genomes and not rejected:
                return "search space exhausted"
            built = session.build(builder, genomes, progress.generation, origins, parents)
            by_key = {g.key(): g for g in genomes}
            only = {k: strategy.cells_for(g) for k, g in by_key.items()}  # None: every legal cell
            items = [EvalItem(by_key[k], session.templates[by_key[k].template], cell, b)
                     for k, pairs in built.items() for cell, b in pairs
                     if only[k] is None or cell.label() in only[k]]
            old = {(it.genome.key(), it.cell.label()): it for it in items if (it.genome.key(), it.cell.label()) in reuse}
            evals = [replace(reuse[k].result, build_key=it.build.build_key) for k, it in old.items()]
            evals += evaluator.evaluate([it for it in items if (it.genome.key(), it.cell.label()) not in old])
            bred = [g for g in genomes if origins.get(g.key()) in ("init", "search")]  # drawn or bred under priors
            rows = [replace(r, reused_from=reuse[(r.genome_key, r.cell)].run_id) if (r.genome_key, r.cell) in old
                    else r for r in session.evaluation_rows(evals, progress.generation, evaluator.fingerprint,
                                                            evaluator.ceiling_gbps, evaluator.source)]
            session.store.write(rows + lesson_rows + learner.bias_uses(bred)
                                + learner.refine_uses(genomes, strategy.cells_for))
            progress.reused += len(old)
            strategy.observe(observations(session, evals, genomes))
            done |= {(ev.genome.key(), ev.cell.label()) for ev in evals}
            improved = update_progress(progress, evals)
            progress.stale = 0 if improved else progress.stale + 1
            show(_line(progress, c) + (f"  rejected {learner.rejected}" if learner.predict else ""))
            progress.generation += 1
            if progress.generation % REFRESH_EVERY == 0:
                learner.refresh()
            session.store.record_elapsed(session.run_id, progress.elapsed)
            session.store.write_snapshot()  # what `kfactory sql/report/lessons` read while this run holds the store


def _display(session: Session) -> Any:
    """Per-generation progress through rich (plain text when stdout is not a terminal)."""
    if session.log is not print:
        return session.log
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    return lambda line: console.print(line)


@dataclass(frozen=True)
class Reused:
    """A result another run measured, usable here: same genome, cell, fingerprint class and source."""

    result: CellEval
    run_id: str


def reusable(session: Session, evaluator: Any) -> dict[tuple[str, str], Reused]:
    """Results other runs measured under the same fingerprint class and source: never measured twice."""
    from evo.loop.pipeline import fingerprint_class

    df = session.store.sql(
        "SELECT e.genome_key, e.cell, e.status, e.median_us, e.p10_us, e.p90_us, e.samples, e.baseline_us, "
        "e.error, coalesce(e.reused_from, e.run_id) AS measured_in, c.template, c.params_json "
        "FROM evaluations e JOIN candidates c USING (genome_key) "
        "WHERE e.fingerprint_class = ? AND e.source = ? AND e.run_id != ? "
        "AND e.status NOT IN ('REJECTED', 'UNKNOWN', 'TIMEOUT', 'CRASH') ORDER BY e.created_at, e.eval_id",
        [fingerprint_class(evaluator.fingerprint), evaluator.source, session.run_id])
    by_label = {c.label(): c for c in session.cells}
    out = {}
    for r in df.itertuples(index=False):
        t = session.templates.get(r.template)
        if t is None or r.cell not in by_label or (r.genome_key, r.cell) in out:
            continue
        g = Genome.make(session.op.name, r.template, t.source_hash, json.loads(r.params_json))
        if g.key() != r.genome_key:
            continue  # another version of the template text
        ev = CellEval(g, by_label[r.cell], Status(r.status), "", _f(r.median_us), _f(r.p10_us), _f(r.p90_us),
                      int(r.samples or 0), _f(r.baseline_us), error=r.error if isinstance(r.error, str) else "")
        out[(r.genome_key, r.cell)] = Reused(ev, r.measured_in)
    return out


def _budget_exhausted(c: Any, p: Progress) -> str:
    if p.evaluated >= c.budget.max_evals:
        return f"budget.max_evals ({c.budget.max_evals}) reached"
    if p.generation >= c.budget.generations:
        return f"budget.generations ({c.budget.generations}) reached"
    if time.monotonic() - p.started >= c.budget.max_seconds:
        return f"budget.max_seconds ({c.budget.max_seconds:.0f}) reached"
    if p.stale >= c.budget.patience:
        return f"no improvement for {p.stale} generations (budget.patience)"
    return ""


def _line(p: Progress, c: Any) -> str:
    left = c.budget.max_seconds - (time.monotonic() - p.started)
    return (f"gen {p.generation:3d}  evaluated {p.evaluated:5d}  failed {p.failed:4d}  cells with a best "
            f"{len(p.best):3d}  geomean speedup {p.geomean_speedup():6.3f}  time left {left:6.0f} s")


def write_dispatch(session: Session, p: Progress, reuse: dict[tuple[str, str], Reused] | None = None
                   ) -> tuple[Path, int]:
    """shape -> genome table (best per cell), plus the single genome with the best geomean.

    The table weighs this run's OK results together with the results it could reuse (other runs'
    measurements under the same fingerprint class and source), so a rerun never ends with a worse
    kernel for a cell than the store already held; returns the file and how many cells came from those.
    """
    df = session.store.sql(
        "SELECT e.genome_key, e.cell, e.median_us, e.baseline_us, c.template, c.params_json, "
        "coalesce(e.reused_from, e.run_id) AS measured_in FROM evaluations e "
        "JOIN candidates c USING (genome_key) WHERE e.run_id = ? AND e.status = 'OK' AND e.median_us IS NOT NULL",
        [session.run_id])
    ours = set(zip(df.genome_key, df.cell))
    extra = pd.DataFrame([{"genome_key": key, "cell": cell, "median_us": r.result.median_us,
                           "baseline_us": r.result.baseline_us, "template": r.result.genome.template,
                           "params_json": r.result.genome.params_json(), "measured_in": r.run_id}
                          for (key, cell), r in (reuse or {}).items()
                          if (key, cell) not in ours and r.result.status is Status.OK
                          and math.isfinite(r.result.median_us)], columns=df.columns)
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

"""budget.max_seconds holds within a generation: the last generation is sized to the time left at the
run's pace (evo.loop.search.fit_in_time), so a run no longer overruns its budget by a whole generation
(an H200 KDA prefill GA once took 230 s of a 180 s budget)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import evo.loop.search as search_mod
from evo.cli.commands import cmd_run
from evo.measure.evaluators import ReplayEvaluator
from evo.loop.search import fit_in_time
from memory.store import Store
from tests.unit.test_search_replay import SMALL



@pytest.mark.parametrize("want,left,spent,genomes,expect", [
    (24, 66.0, 114.0, 12, 6),      # the KDA run's second generation: 9.5 s a genome, 66 s left
    (24, 1000.0, 114.0, 12, 24),   # time enough: the whole population
    (24, 3.0, 114.0, 12, 1),       # under one genome's time left: still one (the budget is checked after)
    (24, 50.0, 0.0, 0, 24),        # no pace yet (first generation, or the first after a resume)
    (0, 50.0, 10.0, 5, 0),
    (6, float("inf"), 10.0, 5, 6),
])
def test_fit_in_time(want, left, spent, genomes, expect):
    assert fit_in_time(want, left, spent, genomes) == expect


@pytest.mark.parametrize("want,left,prior,expect", [
    (16, 100.0, 36 * 0.38, 7),   # the residual serving run's first generation at the serving run's pace
    (16, 1000.0, 36 * 0.38, 16),
    (16, 5.0, 36 * 0.38, 1),
    (16, 100.0, None, 16),       # no GPU run of the op on this arch yet: the whole population
])
def test_a_first_generation_fits_the_budget_at_the_ops_recent_pace(want, left, prior, expect):
    assert fit_in_time(want, left, 0.0, 0, prior) == expect
    assert fit_in_time(want, left, 50.0, 10, prior) == fit_in_time(want, left, 50.0, 10)  # its own pace first


def test_the_gpu_pace_is_the_recent_gpu_runs_seconds_per_measured_evaluation(tmp_path):
    """Per run: search time over its evaluations measured on the GPU (not reused, not replayed); the median over
    the op's last five runs on the arch, the asking run left out."""
    from memory.queries import gpu_pace
    from tests.unit.test_store import evaluation_row, run_row

    runs = [("a", 100.0, 50, 0, "gpu", "2026-12-01"), ("b", 30.0, 100, 100, "gpu", "2026-12-02"),
            ("c", 60.0, 20, 0, "gpu", "2026-12-03"), ("d", 9.0, 3, 0, "replay", "2026-12-04"),
            ("self", 1.0, 1, 0, "gpu", "2026-12-05")]
    rows = []
    for rid, elapsed, n, reused, source, day in runs:
        rows.append(run_row(rid, op="rmsnorm", arch="sm_90a", elapsed_s=elapsed, created_at=f"{day} 00:00:00"))
        rows += [evaluation_row(f"{rid}{i}", run_id=rid, source=source, reused_from=None) for i in range(n)]
        rows += [evaluation_row(f"{rid}r{i}", run_id=rid, source=source, reused_from="x") for i in range(reused)]
    with Store.open(tmp_path / "s.duckdb") as s:
        s.write(rows)
        # a: 2.0 s, b: 0.3 s (its 100 reused ones not counted), c: 3.0 s; d replayed, self asking
        assert gpu_pace(s, "rmsnorm", "sm_90a", "self") == 2.0
        assert gpu_pace(s, "rmsnorm", "sm_100a", "self") is None


# the replay tests' small run (two templates, two cells, population 6) with a time budget
CONFIG = SMALL.replace("{gens}", "50").replace("patience = 50", "patience = 50\nmax_seconds = {budget}")


def test_last_generation_fits_the_time_left(tmp_path, monkeypatch):
    """A fake clock moves 1 s per evaluation and stands still otherwise (here 10 evaluations for 6
    genomes a generation): a 25 s budget ends with a smaller generation, where whole generations took
    30 s."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(search_mod, "time", SimpleNamespace(monotonic=lambda: clock.now))
    real = ReplayEvaluator.evaluate

    def paced(self, items):
        out = real(self, items)
        clock.now += len(items)
        return out

    monkeypatch.setattr(ReplayEvaluator, "evaluate", paced)
    cfg = tmp_path / "paced.toml"
    cfg.write_text(CONFIG.replace("{budget}", "25"))
    assert cmd_run(cfg, tmp_path / "s.duckdb", "r") == 0
    with Store.open(tmp_path / "s.duckdb", read_only=True) as s:
        per_gen = s.sql("SELECT generation, count(DISTINCT genome_key) AS g, count(*) AS n FROM evaluations "
                        "WHERE run_id = 'r' GROUP BY generation ORDER BY generation")
    assert clock.now <= 25 + 2, per_gen  # at most one genome (two cells) past the budget
    assert per_gen.g.iloc[0] == 6 and per_gen.g.iloc[-1] < 6, per_gen
    assert per_gen.n.sum() == clock.now

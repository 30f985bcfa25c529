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

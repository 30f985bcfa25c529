"""The loop's one writer: each generation lands in the store whole, in one transaction, or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from evo.cli.main import main
from memory.rows import EvaluationRow
from memory.store import Batch, Store
from tests.unit.test_search_replay import SMALL

# What a generation writes (`runs` and `lessons` also hold what a finished run adds at its end), less
# what the clock decides: time stamps, and a compile's duration (also in the ptxas log).
TABLES = {"sources": "created_at", "candidates": "created_at", "builds": "created_at, compile_ms, log",
          "evaluations": "created_at", "lesson_uses": "created_at", "llm_calls": "created_at"}


def _config(tmp_path: Path, gens: int) -> str:
    p = tmp_path / f"g{gens}.toml"
    p.write_text(SMALL.replace("{gens}", str(gens)))
    return str(p)


def _content(store: Path) -> dict[str, list[tuple]]:
    """Every row of the generation tables, without the wall-clock stamps, in insertion order."""
    out = {}
    with Store.open(store, read_only=True) as s:
        for t, clock in TABLES.items():
            df = s.sql(f"SELECT * EXCLUDE ({clock}) FROM {t} ORDER BY rowid")
            out[t] = [tuple(None if not isinstance(v, (bytes, str)) and pd.isna(v) else v for v in r)
                      for r in df.itertuples(index=False)]
    return out


def test_a_failure_while_recording_a_generation_leaves_the_earlier_ones_whole(tmp_path, monkeypatch):
    clean = tmp_path / "clean.duckdb"
    assert main(["run", _config(tmp_path, 2), "--store", str(clean), "--run-id", "r"]) == 0

    real = Batch.add_all

    def add_all(self: Batch, rows) -> None:
        rows = list(rows)
        real(self, rows)  # the whole generation is in the open transaction ...
        if any(isinstance(r, EvaluationRow) and r.generation == 2 for r in rows):
            raise OSError("disk full")  # ... when its write fails

    monkeypatch.setattr(Batch, "add_all", add_all)
    (tmp_path / "b").mkdir()
    broken = tmp_path / "b" / "broken.duckdb"
    with pytest.raises(OSError, match="disk full"):
        main(["run", _config(tmp_path, 4), "--store", str(broken), "--run-id", "r"])
    monkeypatch.setattr(Batch, "add_all", real)

    # the dispatch table is rewritten after every recorded generation: a run killed in generation 2
    # (a wall-clock timeout's SIGTERM on the GPU machine) leaves the table of generations 0 and 1
    left = tmp_path / "b" / "runs" / "r" / "dispatch.json"
    assert left.exists()
    clean_table = json.loads((tmp_path / "runs" / "r" / "dispatch.json").read_text())["dispatch"]
    assert clean_table and json.loads(left.read_text())["dispatch"] == clean_table
    got, want = _content(broken), _content(clean)
    assert len(want["evaluations"]) > 0 and len(want["builds"]) > 0
    assert got == want  # generations 0 and 1 exactly as a run that stopped there; nothing of generation 2
    with Store.open(broken, read_only=True) as s:
        assert s.sql("SELECT max(generation) AS g FROM candidates WHERE run_id = 'r'").g[0] == 1
        assert s.sql("SELECT status FROM runs WHERE run_id = 'r'").status[0] == "failed"

    # and the run continues from there as if nothing had happened
    assert main(["resume", "r", "--store", str(broken)]) == 0
    whole = tmp_path / "whole.duckdb"
    assert main(["run", _config(tmp_path, 4), "--store", str(whole), "--run-id", "r"]) == 0
    assert _content(broken)["evaluations"] == _content(whole)["evaluations"]

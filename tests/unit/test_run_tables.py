"""`kfactory evals templates|ceiling` (evo/tools/run_tables.py): within-run tables from a run's evaluations."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from evo.cli.main import main
from evo.tools import run_tables as rt

FP = json.dumps({"gpu": "test"})


def evals() -> pd.DataFrame:
    rows = [  # cell A: t1 fastest at 10 (t1 also 12); t2 at 15 and a failure; cell B: t2 wins 8 vs 16
        ("A", "t1", "OK", 12.0, "g1"), ("A", "t1", "OK", 10.0, "g2"), ("A", "t2", "OK", 15.0, "g3"),
        ("A", "t2", "WRONG_ANSWER", float("nan"), "g4"), ("B", "t1", "OK", 16.0, "g2"), ("B", "t2", "OK", 8.0, "g3"),
    ]
    return pd.DataFrame([{"run_id": "r", "cell": c, "template": t, "status": s, "median_us": us, "genome_key": g,
                          "error": "" if s == "OK" else "dx wrong", "fingerprint_json": FP, "gbps": 2000.0,
                          "ceiling_gbps": 4000.0, "baseline_us": 30.0} for c, t, s, us, g in rows])


def test_templates_table_takes_each_templates_fastest_ok_time_and_counts_failures():
    doc = rt.templates(evals())
    a, b = doc["cells"]
    assert a["winner"] == "t1" and a["us"] == {"t1": 10.0, "t2": 15.0} and a["vs_winner"]["t2"] == pytest.approx(1.5)
    assert b["winner"] == "t2" and b["vs_winner"]["t1"] == pytest.approx(2.0)
    assert doc["wins"] == {"t1": 1, "t2": 1}
    assert doc["failures"] == [{"template": "t2", "status": "WRONG_ANSWER", "n": 1}]
    assert "| A | t1 | 10.0 (1.000) | 15.0 (1.500) |" in rt.templates_md(doc)


def test_ceiling_table_reads_each_dispatch_entrys_own_row(tmp_path):
    dispatch = {"run_id": "r", "dispatch": {"B": {"genome_key": "g3", "params": {}}, "A": {"genome_key": "g2", "params": {}}}}
    doc = rt.ceiling(evals(), dispatch)
    assert [r["cell"] for r in doc["cells"]] == ["A", "B"]
    assert doc["cells"][0]["us"] == 10.0 and doc["cells"][0]["share_of_ceiling"] == pytest.approx(0.5)
    assert doc["cells"][1]["peer_over_ours"] == pytest.approx(30.0 / 8.0)
    p = tmp_path / "e.parquet"
    evals().to_parquet(p)
    (tmp_path / "d.json").write_text(json.dumps(dispatch))
    assert main(["evals", "ceiling", str(p), str(tmp_path / "d.json"), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["cells"][1]["cell"] == "B"

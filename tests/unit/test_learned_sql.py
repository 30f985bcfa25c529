"""`kfactory evals learned` (evo/tools/learned_sql.py) on the committed KDA prefill run: every parameter's values are
accounted for, each parameter's best value is the winners' (1.000), and bad input is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from evo.cli.main import main
from evo.tools import learned_sql

ROOT = Path(__file__).resolve().parents[2]

EVALS = ROOT / "tests" / "fixtures" / "results" / "kda_prefill_h200" / "evaluations.parquet"


def test_param_effects_account_for_every_ok_evaluation(tmp_path):
    ev = pd.read_parquet(EVALS)
    ok = ev[ev.status == "OK"]
    t = learned_sql.tables(EVALS)
    pe = t["param_effects"]
    params = set(json.loads(ok.params_json.iloc[0]))
    assert set(pe.param) == params
    for p, g in pe.groupby("param"):
        assert g.evals.sum() == len(ok), p  # every OK evaluation has one value of every parameter
        assert g.best_vs_cell_best.min() == 1.0 and (g.best_vs_cell_best >= 1.0).all(), p
    # the winner of each cell carries one value per parameter: that value is at 1.000 on that cell
    winner = json.loads(ok.loc[ok.median_us.idxmin()].params_json)
    assert all(((pe.param == k) & (pe.value == json.dumps(v))).any() for k, v in winner.items())
    assert t["outcomes"].evals.sum() == len(ev)
    assert main(["evals", "learned", str(EVALS), str(tmp_path / "l.md")]) == 0
    assert "json_each(o.params_json)" in (tmp_path / "l.md").read_text()


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["evals", "learned", str(tmp_path / "none.parquet"), str(tmp_path / "o.md")]) == 2
    assert "no evaluations file" in capsys.readouterr().err
    pd.DataFrame({"cell": ["a"]}).to_parquet(tmp_path / "x.parquet")
    assert main(["evals", "learned", str(tmp_path / "x.parquet"), str(tmp_path / "o.md")]) == 2
    assert "lacks columns" in capsys.readouterr().err and not (tmp_path / "o.md").exists()

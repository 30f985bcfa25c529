"""`kfactory dispatch merge` (evo/tools/merge_dispatch.py): a search's table over some cells completed by an earlier table,
the first table winning on shared cells, and a table kfactory bench --dispatch reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.tools.merge_dispatch import merge

ROOT = Path(__file__).resolve().parents[2]


def _entry(t: str, us: float) -> dict:
    return {"template": t, "params": {}, "median_us": us, "measured_in": t}


def test_first_table_wins_and_later_tables_fill(tmp_path):
    a = {"run_id": "long", "dispatch": {"c1": _entry("a", 1.0), "c2": _entry("a", 2.0)}}
    b = {"run_id": "old", "dispatch": {"c2": _entry("b", 0.5), "c3": _entry("b", 3.0)}}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "m.json"
    assert main(["dispatch", "merge", str(out), str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 str(tmp_path / "no.json")]) == 0
    m = json.loads(out.read_text())
    assert m["merged_from"] == ["long", "old"]
    assert {k: v["template"] for k, v in m["dispatch"].items()} == {"c1": "a", "c2": "a", "c3": "b"}


def test_fastest_takes_the_lowest_recorded_median_per_cell(tmp_path):
    a = {"run_id": "new", "dispatch": {"c1": _entry("a", 1.0), "c2": _entry("a", 2.0), "c4": _entry("a", 4.0)}}
    b = {"run_id": "old", "dispatch": {"c2": _entry("b", 0.5), "c3": _entry("b", 3.0), "c4": _entry("b", 4.0)}}
    c = {"run_id": "untimed", "dispatch": {"c1": {"template": "c", "params": {}}, "c5": {"template": "c", "params": {}}}}
    paths = []
    for name, doc in (("a", a), ("b", b), ("c", c)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
        paths.append(str(tmp_path / f"{name}.json"))
    out = tmp_path / "m.json"
    assert main(["dispatch", "merge", "--fastest", str(out), *paths]) == 0
    m = json.loads(out.read_text())
    # c2: the older table's faster entry; c4: a tie keeps the first table's; c5: an untimed entry fills
    assert {k: v["template"] for k, v in m["dispatch"].items()} == {"c1": "a", "c2": "b", "c3": "b", "c4": "a",
                                                                    "c5": "c"}
    assert merge([a, b])["dispatch"]["c2"]["template"] == "a"  # without it, the first table wins


def test_a_file_without_dispatch_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="table 1 has no 'dispatch'"):
        merge([{"dispatch": {}}, {"cells": []}])
    assert main(["dispatch", "merge", str(tmp_path / "m.json"), str(tmp_path / "none.json")]) == 2
    assert "no dispatch table to merge" in capsys.readouterr().err


def test_merged_committed_table_is_a_bench_plan(tmp_path):
    from evo.cli.bench import dispatch_plan
    from evo.templates.template import load_templates
    from ops.rmsnorm.spec import SPEC

    src = ROOT / "tests" / "fixtures" / "results" / "rmsnorm_h200_regimes" / "dispatch.json"
    t = json.loads(src.read_text())
    first = {"run_id": "part", "dispatch": dict(list(t["dispatch"].items())[:5])}
    (tmp_path / "part.json").write_text(json.dumps(first))
    out = tmp_path / "m.json"
    assert main(["dispatch", "merge", str(out), str(tmp_path / "part.json"), str(src)]) == 0
    plan = dispatch_plan(SPEC, load_templates("rmsnorm"), out)
    assert len(plan) == len(t["dispatch"]) == 36

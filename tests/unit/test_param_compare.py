"""`kfactory evals compare` (evo/tools/param_compare.py): one parameter's values against each other in one run's evaluations."""

from __future__ import annotations

import json

import pytest

from evo.cli.main import main
from evo.tools import param_compare as pc

A, B = "w=bf16,x=bf16 M32768-N4096", "w=fp32,x=fp32 M32768-N8192"


def _row(i: int, cell: str, us: float | None, prefetch: bool | None, status: str = "OK", template: str = "cluster_rows"):
    params = {"threads": 256} | ({} if prefetch is None else {"prefetch": prefetch})
    return {"eval_id": f"e{i}", "genome_key": f"g{i}", "cell": cell, "status": status, "median_us": us,
            "template": template, "params_json": json.dumps(params)}


ROWS = [_row(0, A, 240.0, False), _row(1, A, 220.0, True), _row(2, A, 210.0, True, status="WRONG_ANSWER"),
        _row(3, A, 230.0, True), _row(4, B, 800.0, False), _row(5, B, 100.0, None), _row(6, B, 50.0, True, template="x")]


def test_each_cell_gets_each_values_fastest_ok_evaluation_and_its_ratio():
    table = pc.compare(ROWS, "prefetch", "cluster_rows")
    a, b = table
    assert a["cell"] == A and a["fastest_us"] == 220.0  # the faster WRONG_ANSWER is not a time
    assert a["values"]["true"]["genome_key"] == "g1" and a["values"]["false"]["over_fastest"] == pytest.approx(240 / 220)
    assert b["values"]["true"] is None and b["values"]["false"]["median_us"] == 800.0  # other template, no param: left out
    md = pc.markdown(table).splitlines()
    assert md[0] == "| cell | prefetch=false µs (/ fastest) | prefetch=true µs (/ fastest) |"
    assert md[2] == f"| {A} | 240.0 (1.091) | 220.0 (1.000) |" and md[3] == f"| {B} | 800.0 (1.000) | absent |"


def test_a_param_no_evaluation_sets_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no OK evaluation sets 'stages' in template 'cluster_rows'"):
        pc.compare(ROWS, "stages", "cluster_rows")


def test_it_reads_a_real_parquet_and_writes_json(tmp_path):
    import duckdb

    src = tmp_path / "evaluations.parquet"
    con = duckdb.connect()
    con.execute("CREATE TABLE e (eval_id VARCHAR, genome_key VARCHAR, cell VARCHAR, status VARCHAR, median_us DOUBLE, "
                "template VARCHAR, params_json VARCHAR, extra INTEGER)")
    con.executemany("INSERT INTO e VALUES (?, ?, ?, ?, ?, ?, ?, 1)", [tuple(r.values()) for r in ROWS])
    con.execute(f"COPY e TO '{src}' (FORMAT parquet)")
    out = tmp_path / "cmp.json"
    assert main(["evals", "compare", str(src), "prefetch", "--template", "cluster_rows", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["rows"] == pc.compare(ROWS, "prefetch", "cluster_rows")
    assert main(["evals", "compare", str(src), "stages"]) == 2

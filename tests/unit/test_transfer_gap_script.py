"""The transfer-gap report, on a hand-made sweep (the committed numbers come from this code)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("transfer_gap", ROOT / "experiments" / "scripts" / "transfer_gap.py")
assert _spec and _spec.loader
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)


def sweep(rows: list[tuple[int, str, float]], dtype: str = "bfloat16", regs: int = 0) -> pd.DataFrame:
    """(N, genome_key, median_us) rows of one dtype and M; genome k has params {"g": k}."""
    return pd.DataFrame([{"dtype": dtype, "M": 4096, "N": n, "cell": f"{dtype} N{n}", "genome_key": k,
                          "template": "t", "params_json": json.dumps({"g": k}), "regs": regs,
                          "status": "OK", "median_us": t} for n, k, t in rows])


def test_champion_that_carries_over_has_rank_zero_and_one_that_does_not_is_out_of_reach() -> None:
    df = sweep([
        (16384, "a", 10.0), (16384, "b", 10.5), (16384, "c", 11.0), (16384, "d", 20.0),
        (32768, "a", 30.0), (32768, "b", 29.0), (32768, "c", 40.0), (32768, "d", 20.0),  # d wins at 32768
        (4096, "a", 1.0), (4096, "b", 2.0),
        (8192, "a", 3.0), (8192, "b", 3.02),  # a, the N=4096 champion, is the best at 8192 too
    ])
    doc = T.report(df)
    by_cell = {c["cell"]: c for c in doc["cells"]}
    far = by_cell["bfloat16 N32768"]
    assert far["sources"][0]["source_N"] == 16384
    assert far["sources"][0]["top3_rel_here"] == [1.5, 1.45, 2.0]
    assert far["best_rank"] == 3  # d is the only genome within 1% there, and the 4th at N=16384
    near = by_cell["bfloat16 N8192"]
    assert near["best_rank"] == 0 and near["within_1pct_genomes"] == 2
    assert doc["out_of_reach_of_top3_transfer"] == ["bfloat16 N32768"]
    assert far["best"] == {"template": "t", "g": "d"} and far["sources"][0]["top3"][0] == {"template": "t", "g": "a"}
    assert far["within_1pct_values"] == {"g": {'"d"': 1}, "template": {'"t"': 1}} and far["within_1pct_regs"] is None
    assert far["sources"][0]["source_within_1pct_values"]["g"] == {'"a"': 1}


def test_failed_rows_are_not_timings() -> None:
    df = sweep([(4096, "a", 1.0), (8192, "a", 5.0), (8192, "b", 2.0)])
    df.loc[(df.N == 8192) & (df.genome_key == "b"), "status"] = "WRONG_ANSWER"
    (cell,) = T.report(df)["cells"]
    assert cell["best_rank"] == 0 and cell["genomes"] == 1  # the wrong answer's 2.0 us sets no best


def test_other_dtypes_are_offered_as_sources_and_registers_are_ranged() -> None:
    bf = sweep([(16384, "a", 10.0), (32768, "a", 30.0), (32768, "b", 20.0)], regs=0)
    fp = sweep([(16384, "b", 5.0), (16384, "a", 9.0), (32768, "b", 40.0)], dtype="float32", regs=120)
    doc = T.report(pd.concat([bf, fp], ignore_index=True))
    by_cell = {c["cell"]: c for c in doc["cells"]}
    bf_far = by_cell["bfloat16 N32768"]
    (other,) = bf_far["other_dtype_sources"]
    assert other["source_dtype"] == "float32" and other["first_within_1pct_rank"] == 0  # fp32's champion b wins
    assert bf_far["best_rank"] is None  # b never ran on bf16 N=16384: only the other dtype offers it
    assert bf_far["within_1pct_regs"] is None  # no recorded count (0) is no range
    assert by_cell["float32 N32768"]["within_1pct_regs"] == [120, 120]

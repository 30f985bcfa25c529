"""experiments/scripts/carry_estimate.py: the estimate of recur_addr = carry on kda_prefill_h200_15's dispatch, from
committed measurements and SASS counts (no GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("carry_estimate", ROOT / "experiments/scripts/carry_estimate.py")
assert _spec and _spec.loader
E = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(E)


def test_the_estimate_scales_only_the_recurrence_and_matches_the_committed_file(tmp_path):
    E.main(str(tmp_path / "e.json"))
    rows = json.loads((tmp_path / "e.json").read_text())["rows"]
    assert rows == json.loads((ROOT / "experiments/results/carry_estimate.json").read_text())["rows"]
    dispatch = json.loads((ROOT / "experiments/results/kda_prefill_h200_15/dispatch.json").read_text())["dispatch"]
    assert sorted(r["cell"] for r in rows) == sorted(dispatch)
    for r in rows:
        assert r["chunk_loop_carry"] < r["chunk_loop"] and 0 < r["recur_us"] < r["total_us"]
        saved = r["recur_us"] * (1 - r["chunk_loop_carry"] / r["chunk_loop"])
        assert abs(r["total_us"] - r["proportional"]["total_us"] - saved) < 1e-6
        assert abs(r["total_us"] - r["half"]["total_us"] - saved / 2) < 1e-6
        for model in ("proportional", "half"):
            assert abs(r[model]["ratio"] - r["fla_us"] / r[model]["total_us"]) < 1e-12
        assert r["ratio"] < r["half"]["ratio"] < r["proportional"]["ratio"]

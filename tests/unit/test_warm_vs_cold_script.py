"""The warm-vs-cold benchmark's measures, on hand-made traces (the committed numbers come from these)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("warm_vs_cold", ROOT / "experiments" / "scripts" / "warm_vs_cold.py")
assert _spec and _spec.loader
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)


def trace(*evals: tuple[str, str, float | None]) -> dict:
    return {"cell": [e[0] for e in evals], "status": [e[1] for e in evals], "median_us": [e[2] for e in evals],
            "rejected": 0, "seeded": 0}


def test_measure_counts_evaluations_until_every_cell_is_within_1pct() -> None:
    best = {"a": 10.0, "b": 20.0}
    t = trace(("a", "OK", 10.5), ("b", "WRONG_ANSWER", None), ("b", "OK", 20.1), ("a", "OK", 10.09), ("a", "OK", 9.0))
    m = W.measure(t, best)
    assert m["evals_all_cells_within_1pct"] == 4  # a reaches 10.09 <= 10.1 at the 4th evaluation
    assert m["evals_90pct_cells_within_1pct"] == 4
    assert m["wasted_until_target"] == 1 and m["wasted_share"] == pytest.approx(1 / 5)
    never = W.measure(trace(("a", "OK", 10.2), ("b", "OK", 20.0)), best)
    assert never["evals_all_cells_within_1pct"] is None and never["wasted_until_target"] == 0


def test_gpu_reference_is_the_median_of_final_bests() -> None:
    rows = [{"warm": trace(("a", "OK", 10.0), ("a", "OK", 9.0)), "cold": trace(("a", "OK", 11.0))},
            {"warm": trace(("a", "OK", 12.0)), "cold": trace(("a", "CRASH", None), ("a", "OK", 8.0))}]
    assert W.gpu_reference(rows) == {"a": pytest.approx(10.0)}  # median of 9, 11, 12, 8


def test_config_text_narrows_cells_and_sets_budget() -> None:
    base = (ROOT / "experiments" / "rmsnorm_h200_ga.toml").read_text()
    text = W.config_text(base, W.HALF_B, 7, "half-b", W.GPU)
    assert "seed = 7" in text and 'name = "half-b"' in text and "max_evals = 360" in text
    assert "N = [2048, 8192, 32768]" in text and "matrix = false" in text and "matrix = true" not in text


def test_config_text_loads(tmp_path: Path) -> None:
    from evo.core.config import load_config

    for budget in (W.GPU, W.REPLAY):
        path = tmp_path / "c.toml"
        path.write_text(W.config_text(Path(budget["config"]).read_text(), W.HALF_A, 3, "half-a", budget))
        c = load_config(path)
        assert c.run.seed == 3 and c.budget.max_evals == budget["max_evals"]

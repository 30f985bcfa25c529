"""experiments/scripts/rmsnorm_targets.py: each target rule on cells built to sit either side of it (the committed
targets.md is checked beside the published tables, tests/unit/test_results_tables.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rmsnorm_targets", ROOT / "experiments" / "scripts" / "rmsnorm_targets.py")
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)


def _row(cell: str, package: float, peers: dict[str, float], pct: float = 100.0, peer_pct: float = 100.0,
         column: str = "kernel") -> dict:
    side = lambda us, p: {"status": "ok", f"{column}_us": us, "pct_ceiling": p}  # noqa: E731
    sides = {"package": side(package, pct), "package.into": side(package / 2, pct)}  # into is never a peer
    sides.update({n: side(us, peer_pct) for n, us in peers.items()})
    sides["flashinfer"] = {"status": "absent", "reason": "not installed"}
    return {"cell": cell, "sides": sides}


def test_forward_rules():
    rows = [_row("at least the best peer", 10.0, {"quack": 10.0}),
            _row("on the ceiling, 0.99x", 10.0, {"quack": 9.9}, pct=97.0),
            _row("on the ceiling, under 0.99x", 10.0, {"quack": 9.8}, pct=99.0),
            _row("off the ceiling, 0.995x", 10.0, {"quack": 9.95}, pct=96.0),
            _row("peer under 70%, 1.12x", 10.0, {"liger": 11.2}, pct=70.0, peer_pct=62.0),
            _row("peer under 70%, 1.05x", 10.0, {"liger": 10.5}, pct=70.0, peer_pct=66.0)]
    cells, notes = T.check_table("forward", rows)
    assert [c["verdict"] for c in cells] == ["meets", "meets", "misses", "misses", "meets", "misses"]
    assert cells[4]["best"] == "liger" and cells[0]["x"] == pytest.approx(1.0)
    assert notes == [f"cells whose best peer is under 70% of the ceiling: geomean {(1.12 * 1.05) ** 0.5:.3f}x (misses 1.25x)"]


def test_serving_rules_take_call_time_and_quacks_geomean():
    rows = [_row("a", 10.0, {"torch.eager": 9.0, "quack": 14.0}, column="call"),
            _row("b", 10.0, {"torch.eager": 11.0, "quack": 13.0}, column="call")]
    cells, notes = T.check_table("serving", rows)
    assert [c["verdict"] for c in cells] == ["misses", "meets"]
    assert notes == [f"call time against QuACK: geomean {(1.4 * 1.3) ** 0.5:.3f}x over 2 cells (meets 1.3x)"]


def test_backward_needs_quack_autotuned_and_the_best_peer():
    rows = [_row("tuned slower", 10.0, {"quack.autotuned": 12.0, "liger": 30.0}),
            _row("best peer faster", 10.0, {"quack.autotuned": 12.0, "cudnn": 9.0}),
            _row("no tuned quack", 10.0, {"liger": 30.0})]
    cells, notes = T.check_table("backward", rows)
    assert [c["verdict"] for c in cells] == ["meets", "misses", "misses"]
    assert cells[2]["why"] == "QuACK autotuned absent"
    assert notes == ["against QuACK autotuned: geomean 1.200x over 2 cells (meets 1.15x)"]


def test_the_training_step_needs_1_10x_the_best_peers_step():
    cells, _ = T.check_table("train", [_row("a", 10.0, {"torch.compile": 11.2}), _row("b", 10.0, {"liger": 10.5})])
    assert [c["verdict"] for c in cells] == ["meets", "misses"]

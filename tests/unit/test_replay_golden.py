"""A seeded replay run gives exactly the evaluations recorded in tests/unit/data/replay_golden.json
(recorded with the code before the gate and op-contract changes, and checked identical after them):
refactors of the engine must not change what the search evaluates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "scripts"))

from replay_golden import GOLDEN, digest  # noqa: E402


def test_replay_evaluations_match_the_golden_record():
    want = json.loads(GOLDEN.read_text())
    got = digest(ROOT)
    assert got["evaluations"] == want["evaluations"] > 100
    assert got == want

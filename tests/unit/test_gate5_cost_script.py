"""The gate-5 cost script's two gates on the fake device: the real gate (counting) and gate 4's reuse."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.verify import judge
from ops.rmsnorm.spec import SPEC, cell
from tests.unit import fake_device
from tests.unit.fake_device import FakeDevice, rms_job
from tests.unit.test_gate import forge_reference, honest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gate5_cost", ROOT / "experiments" / "scripts" / "gate5_cost.py")
assert _spec and _spec.loader
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)

CELL = cell("fp16", 37, 256)
G = Genome.make("rmsnorm", "fake", "", {})
REL = {"y": SPEC.tolerance(CELL, "y").rel_norm}


def run(cls, kernel):
    dev = FakeDevice({"cand": kernel})
    gate = cls(dev, rms_job(CELL), "cand", "ref", fake_device.rms_device, random.Random(0), (("gpu", "fake"),),
               dev.ceiling_gbps)
    return judge(gate.run(), REL, G, CELL), gate


def test_the_counting_gate_is_the_gate_and_recomputes_the_reference_per_check():
    v, gate = run(C.Counting, honest)
    assert v.status is Status.OK, v.error
    # one reference per checked comparison at least (gate 5), never fewer
    assert gate.refs_computed >= len(gate.checks)
    v, _ = run(C.Counting, forge_reference)
    assert v.status is Status.WRONG_ANSWER and "stress 2/4" in v.error, v


def test_the_reused_reference_gate_is_gate_4_fewer_references_and_blind_to_a_forger():
    v5, g5 = run(C.Counting, honest)
    v4, g4 = run(C.ReusedReference, honest)
    assert v4.status is Status.OK, v4.error
    assert 0 < g4.refs_computed < g5.refs_computed
    # what gate 5 closed: with the reuse, the forger is not caught at its first forged stress launch
    v, _ = run(C.ReusedReference, forge_reference)
    assert "stress 2/4" not in v.error, v

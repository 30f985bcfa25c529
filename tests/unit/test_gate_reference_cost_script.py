"""The gate-reference cost script's two gates on the fake device: the gate (6: computed once per set, audited)
and gate 5's policy (recomputed before every comparison)."""

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
_spec = importlib.util.spec_from_file_location("gate_reference_cost",
                                               ROOT / "experiments" / "scripts" / "gate_reference_cost.py")
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


def test_both_gates_pass_the_honest_kernel_and_the_gate_computes_fewer_references():
    v6, g6 = run(C.Counting, honest)
    v5, g5 = run(C.Recomputed, honest)
    assert v6.status is Status.OK and v5.status is Status.OK, (v6.error, v5.error)
    assert g5.refs_computed >= len(g5.checks)  # gate 5: one per checked comparison at least
    assert 0 < g6.refs_computed < len(g6.checks) < g5.refs_computed


def test_both_gates_reject_the_forger_at_its_first_forged_check():
    v6, _ = run(C.Counting, forge_reference)
    assert v6.status is Status.INPUT_MODIFIED and "stress 2/4" in v6.error, v6
    v5, _ = run(C.Recomputed, forge_reference)
    assert v5.status is Status.WRONG_ANSWER and "stress 2/4" in v5.error, v5

"""experiments/scripts/rmsnorm_host_fake.py without torch: the ratios it keeps per process (its child needs an
exported package and torch, as rmsnorm_host_fake_cpu.json, in git history, records)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rmsnorm_host_fake", ROOT / "experiments/scripts/rmsnorm_host_fake.py")
rhf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rhf)


def test_each_side_is_divided_by_its_own_eager_control():
    got = rhf.over_eager({"package": 300.0, "torch.eager": 200.0, "variant.custom_op": 450.0,
                          "variant.function": 240.0, "variant.torch.eager": 300.0})
    assert got["package_over_eager"] == pytest.approx(1.5)
    assert got["variant_over_eager"] == {"custom_op": pytest.approx(1.5), "function": pytest.approx(0.8)}


def test_a_package_without_the_variant_sides_has_no_variant_ratios():
    got = rhf.over_eager({"package": 100.0, "torch.eager": 400.0})
    assert got == {"package_over_eager": 0.25, "variant_over_eager": {}}

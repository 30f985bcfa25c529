"""The GPU session scripts name files that exist: a typo found on the GPU machine costs device time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "experiments" / "scripts").glob("*.sh"))
PATH = re.compile(r"(?<![\w/$.-])((?:experiments|tests|ops|templates)/[\w./-]+\.(?:toml|py|json|txt|duckdb))")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_path_a_gpu_script_names_exists(script):
    paths = set(PATH.findall(script.read_text()))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{script.name} names missing files: {missing}"


def test_the_issue14_script_names_its_inputs():
    """The pattern finds what the script uses (so the test above checks something)."""
    found = set(PATH.findall((ROOT / "experiments" / "scripts" / "issue14_gpu.sh").read_text()))
    assert {"experiments/rmsnorm_bwd_h200_all.toml", "experiments/rmsnorm_residual_h200.toml",
            "tests/gpu/test_kda_device.py", "experiments/results/rmsnorm_bwd_h200/store.duckdb"} <= found

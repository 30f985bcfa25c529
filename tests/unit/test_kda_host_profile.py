"""experiments/scripts/kda_host_profile.py without a GPU: its timing loop and profile rows
(evo/tools/host_profile.py's) and its comparison of two profiles (the GPU part needs an exported package and
torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from evo.tools import host_profile as hp

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("kda_host_profile", ROOT / "experiments/scripts/kda_host_profile.py")
khp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(khp)

CELL = "g=fp32,state=fp32,x=bf16 B1-H32-HV32-K128-N1-Ncu2-SC128-SR128-T8192-V128-beta_act0-gate0"


def _doc(gpu: str, us: float) -> dict:
    return {"gpu": gpu, "cells": [{"cell": CELL, "entry": "chunk_kda", "host_us_median": us}]}


def test_compare_gives_each_cells_times_and_their_ratio():
    table = khp.compare(_doc("H100", 200.0), _doc("H100", 80.0))
    assert "| chunk_kda | B1-H32-T8192 | 200.0 | 80.0 | 2.50x |" in table.splitlines()


def test_compare_refuses_profiles_from_different_gpus():
    with pytest.raises(ValueError, match="different GPUs"):
        khp.compare(_doc("H100", 1.0), _doc("H200", 1.0))


def test_the_timing_loop_syncs_outside_the_timed_calls_and_the_profile_names_the_costly_function():
    events = []

    def costly() -> int:  # a plain loop: its time is its own, not shared with a builtin it calls
        total = 0
        for i in range(20000):
            total += i * i
        return total

    def slow():
        events.append("call")
        costly()

    def sync():
        events.append("sync")

    times = khp.host_times_us(slow, 40, sync)
    assert len(times) == 40 and min(times) > 0
    assert events.count("sync") == 1 + 40 // hp.SYNC_EVERY + 1 and events.count("call") == hp.WARMUP + 40
    rows = khp.profile_rows(slow, 10, sync, top=5)
    assert rows[0]["own_us_per_call"] >= rows[-1]["own_us_per_call"]
    assert rows[0]["function"] == "costly"  # where slow() spends its time
    assert rows[0]["own_us_per_call"] > 5 * rows[1]["own_us_per_call"]
    assert next(r for r in rows if r["function"] == "slow")["calls_per_call"] == 1.0

"""The published tables are generated from the canonical result folders: the committed README and docs equal
the generator's output, and the generator says what each table is (one process, its card, every peer's fate)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "scripts" / "results_tables.py"


def _module():
    spec = importlib.util.spec_from_file_location("results_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_tables_are_the_generators_output():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_the_committed_rmsnorm_targets_page_is_the_scripts_output():
    path = SCRIPT.with_name("rmsnorm_targets.py")
    spec = importlib.util.spec_from_file_location("rmsnorm_targets", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    folder = SCRIPT.parents[1] / "results" / "rmsnorm" / "h100"
    assert (folder / "targets.md").read_text() == mod.report(folder) + "\n"


def _side(k: float, c: float) -> dict:
    return {"status": "ok", "kernel_us": k, "call_us": c, "pct_ceiling": 50.0}


def _doc(cells: list[dict], card: str = "NVIDIA H100 80GB HBM3", regex: str | None = None) -> dict:
    return {"measured_at": "2026-12-01T10:00:00+00:00", "complete": True, "tables": ["forward"], "samples": 100,
            "cells_regex": regex, "copy_ceiling": {"gbps": 3000.0},
            "environment": {"card": {"name": card, "sms": 132, "smi": {"driver_version": "580.1"}},
                            "driver_cuda": "13.0", "torch": "2.9.0", "triton": "3.5.0", "nvrtc": "13.0",
                            "peers": {"liger-kernel": "0.8.5", "flashinfer-python": None}},
            "cells": cells}


def _cell(label: str, mine: float, peer: float, correct: bool = True) -> dict:
    sides = {"package": _side(mine, mine + 5) if correct else {"status": "wrong", "reason": "max err 1"},
             "liger": _side(peer, peer + 20),
             "flashinfer": {"status": "absent", "reason": "not installed: No module named 'flashinfer'"}}
    return {"table": "forward", "cell": label, "path": "table", "correct": correct, "sides": sides,
            "best_peer_kernel": "liger", "best_peer_call": "liger",
            "speedup_kernel": peer / mine if correct else None,
            "speedup_call": (peer + 20) / (mine + 5) if correct else None}


def test_a_table_says_its_card_peers_speedups_and_what_was_not_timed(tmp_path):
    rt = _module()
    folder = tmp_path / "rmsnorm" / "h100"
    folder.mkdir(parents=True)
    cells = [_cell("M1-N4096", 10.0, 20.0), _cell("M2-N4096", 10.0, 5.0), _cell("M3-N4096", 10.0, 9.0, False)]
    (folder / "rmsnorm_bench_a.json").write_text(json.dumps(_doc(cells)))
    (folder / "rmsnorm_bench_b.json").write_text(json.dumps(_doc(cells[:1], regex="x=bf16")))
    tables = rt.load_tables(tmp_path)
    assert [t.name for t in tables] == ["forward", "forward, cells x=bf16"]
    out = rt.render(tables)
    first = out["summary"].splitlines()[2]
    assert "RMSNorm forward | H100 | 3 | 1.00x (1/2)" in first and "| 1 |" in first  # sqrt(2 * 0.5) = 1
    d = out["details"]
    assert "NVIDIA H100 80GB HBM3 (132 SMs), 2026-12-01, driver 580.1" in d and "flashinfer-python not installed" in d
    assert "| M3-N4096 | table | **wrong** |" in d
    assert "- flashinfer: absent on 3/3 cells (not installed: No module named 'flashinfer')" in d
    assert "- package: wrong on 1/3 cells (max err 1)" in d
    # long labels lose what every cell of the table shares, which the table says once
    assert rt.short_labels(["x=bf16 B1-K128-T64", "x=bf16 B4-K128-T64"]) == ("x=bf16 K128-T64", ["B1", "B4"])
    assert rt.short_labels(["x=bf16 M1-N8", "x=fp16 M1-N8"]) == ("M1-N8", ["x=bf16", "x=fp16"])
    # a table is one process: the same table twice in one folder, or a file in another card's folder, is refused
    (folder / "rmsnorm_bench_c.json").write_text(json.dumps(_doc(cells)))
    with pytest.raises(ValueError, match="is in both rmsnorm_bench_a.json and rmsnorm_bench_c.json"):
        rt.load_tables(tmp_path)
    (folder / "rmsnorm_bench_c.json").rename(tmp_path / "x.json")
    (folder.parent / "h200").mkdir()
    (folder.parent / "h200" / "rmsnorm_bench_a.json").write_text(json.dumps(_doc(cells)))
    with pytest.raises(ValueError, match="measured on NVIDIA H100 80GB HBM3, not a h200"):
        rt.load_tables(tmp_path)


def test_a_kda_table_gives_each_cells_floor_and_the_share_the_package_reaches(tmp_path):
    rt = _module()
    folder = tmp_path / "kda" / "h100"
    folder.mkdir(parents=True)
    cells = [_cell("B1-T8192", 400.0, 500.0), _cell("B1-T1", 4.0, 5.0)]
    cells[0]["floor"] = {"floor_us": 134.0, "bound": "bytes", "share": 134.0 / 400.0}
    cells[1]["floor"] = {"floor_us": None, "bound": None, "share": None}
    (folder / "kda_bench_a.json").write_text(json.dumps(_doc(cells)))
    d = rt.render(rt.load_tables(tmp_path))["details"]
    assert "| % of copy ceiling | floor µs (bound) | share of floor |" in d
    assert "| 50% | 134 (bytes) | 34% |" in d and "| 50% | – | – |" in d


def test_the_warm_rerun_the_readme_cites_is_consistent() -> None:
    """experiments/results/warm_rerun_replay.json (experiments/scripts/warm_rerun.py), the README's run times."""
    r = json.loads((SCRIPT.parents[1] / "results" / "warm_rerun_replay.json").read_text())
    assert r["warm_faster"] and r["warm"]["wall_s"] < r["cold"]["wall_s"]
    assert r["warm"]["compiles"] == 0 and r["warm"]["builds_reused"] == r["cold"]["compiles"]
    assert r["warm"]["evaluations_measured"] + r["warm"]["evaluations_reused"] == r["warm"]["evaluations"]
    assert r["best_per_cell"]["cells"] == 36 and r["best_per_cell"]["cells_worse_after"] == []


def test_a_table_with_host_times_gives_the_packages_beside_torch_eagers(tmp_path):
    rt = _module()
    folder = tmp_path / "rmsnorm" / "h100"
    folder.mkdir(parents=True)
    cells = [_cell("M1-N4096", 4.0, 5.0), _cell("M8-N4096", 4.0, 5.0)]
    cells[0]["sides"]["package"]["host_us"] = 13.9
    cells[0]["sides"]["torch.eager"] = _side(9.0, 40.0) | {"host_us": 11.2}
    (folder / "rmsnorm_bench_a.json").write_text(json.dumps(_doc(cells)))
    d = rt.render(rt.load_tables(tmp_path))["details"]
    assert "| % of copy ceiling | package host µs | torch eager host µs |" in d
    assert "| 13.9 | 11.2 |" in d and "| – | – |" in d  # a row without them says so

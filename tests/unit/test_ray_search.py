"""The same experiment on the Ray backend (local cluster on this machine) and locally gives the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memory.store import Store
from tests.unit.test_search_replay import SMALL

pytest.importorskip("ray")


def _run(cfg: Path, store: Path, cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "evo.cli.main", "run", str(cfg), "--store", str(store), "--run-id", "r"],
                       cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ray_backend_matches_local(tmp_path):
    base = SMALL.replace("{gens}", "2")
    local, ray = tmp_path / "local.toml", tmp_path / "ray.toml"
    local.write_text(base)
    ray.write_text(base.replace('runner = "replay"', 'runner = "replay"\nbackend = "ray"'))
    _run(local, tmp_path / "l.duckdb", tmp_path)
    _run(ray, tmp_path / "r.duckdb", tmp_path)
    q = "SELECT b.build_key, b.status, e.cell, e.status AS es, e.median_us FROM evaluations e JOIN builds b USING (build_key) ORDER BY 1, 3"
    with Store.open(tmp_path / "l.duckdb", read_only=True) as s:
        a = s.sql(q)
    with Store.open(tmp_path / "r.duckdb", read_only=True) as s:
        b = s.sql(q)
    assert len(a) > 10 and a.equals(b)

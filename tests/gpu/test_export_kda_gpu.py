"""An exported KDA package on the GPU: the fixture decode run exported, then the package's own tests
(every searched cell, off-table batches, T and head dims, compiled-in variants, the torch path's
variants, fla's return convention) run against a float64 reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evo.cli.main import main
from memory.store import Store
from tests.unit import kda_export_fixtures as kx

pytestmark = pytest.mark.gpu


def test_exported_kda_package_passes_its_own_gpu_tests(tmp_path):
    pytest.importorskip("torch")
    store = tmp_path / "s.duckdb"
    with Store.open(store) as s:
        kx.write_run(s, kx.build_all())
    out = tmp_path / "kf_kda_gpu"
    assert main(["export", kx.RUN, "--store", str(store), "--out", str(out), "--name", "kf_kda_gpu"]) == 0
    env = {**os.environ, "PYTHONPATH": str(out), "KF_KDA_GPU_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
                       capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env, check=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "skipped: no CUDA GPU" not in r.stdout and " failed" not in r.stdout

"""An exported package on the GPU: the fixture run's table exported (and, beside it, the committed
backward run of the H200), then the package's own tests (every table cell, off-table shapes, variants,
dx and dw, autograd through forward and backward, torch.compile against float64) run against it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from evo.cli.main import main
from memory.store import Store
from tests.unit import bwd_export_fixtures as bx
from tests.unit import export_fixtures as fx

pytestmark = pytest.mark.gpu


def test_exported_package_passes_its_own_gpu_tests(tmp_path):
    pytest.importorskip("torch")
    store = fx.make_store(tmp_path / "s.duckdb", fx.build_all())
    out = tmp_path / "kf_gpu"
    assert main(["export", fx.RUN, "--store", str(store), "--out", str(out), "--name", "kf_gpu"]) == 0
    env = {**os.environ, "PYTHONPATH": str(out), "KF_GPU_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
                       capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env, check=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "skipped: no CUDA GPU" not in r.stdout and " failed" not in r.stdout


def test_forward_and_backward_package_passes_its_own_gpu_tests(tmp_path):
    pytest.importorskip("torch")
    store = bx.copy_results(tmp_path / "r")  # the committed backward run, with the fixture forward run beside it
    with Store.open(store) as s:
        fx.write_run(s, fx.build_all())
    out = tmp_path / "kf_both"
    nvrtc = bx.nvrtc_args(tmp_path / "nvrtc")
    assert main(["export", bx.RUN, fx.RUN, "--store", str(store), "--out", str(out), "--name", "kf_both", *nvrtc]) == 0
    env = {**os.environ, "PYTHONPATH": str(out), "KF_BOTH_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
                       capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env, check=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "skipped: no CUDA GPU" not in r.stdout and " failed" not in r.stdout
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= 7 + 13 + 5, r.stdout[-2000:]  # backward cells, off-table, autograd

"""The committed backward run of the H200 (rmsnorm_bwd_h200, frozen under tests/fixtures/results/) for the export tests:
its store (committed gzipped) and published table copied to a tmp folder (the committed files are only
read), and the NVRTC that built its cubins, for the export's byte-for-byte rebuild."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from evo.build.nvrtc import compiler_version

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "fixtures" / "results" / "rmsnorm_bwd_h200"
RUN = "rmsnorm-bwd-h200-20261203-082241-0ee0f3"
NVRTC = "nvrtc-13.0"  # what the store's builds say built every cubin of the run
# The H200 image's NVRTC (torch 2.11+cu130): it rebuilds the run's cubins byte for byte (test_export_bwd).
NVRTC_WHEEL = "nvidia-cuda-nvrtc==13.0.88"


def committed_sha256() -> str:
    return hashlib.sha256((RESULTS / "store.duckdb.gz").read_bytes()).hexdigest()


def copy_results(dest: Path) -> Path:
    """store.duckdb (unpacked) and dispatch.json copied into `dest` (writable copies); the copy's store path."""
    dest.mkdir(parents=True, exist_ok=True)
    with gzip.open(RESULTS / "store.duckdb.gz") as src, open(dest / "store.duckdb", "wb") as out:
        shutil.copyfileobj(src, out)
    shutil.copyfile(RESULTS / "dispatch.json", dest / "dispatch.json")  # content only: the copy is writable
    return dest / "store.duckdb"


def nvrtc_args(dest: Path) -> list[str]:
    """`--nvrtc DIR` with the run's NVRTC pip-installed into `dest`, or nothing where this process's NVRTC
    is already that version; RuntimeError when it cannot be installed."""
    if compiler_version() == NVRTC:
        return []
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest), NVRTC_WHEEL],
                       capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"cannot install {NVRTC_WHEEL} (the NVRTC that built run {RUN}): {r.stderr[-2000:]}")
    return ["--nvrtc", str(dest)]

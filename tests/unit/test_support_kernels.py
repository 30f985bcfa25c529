"""The GPU worker's support kernels (evo/measure/cuda/support.cu) compile for sm_90a with NVRTC on the
CPU, and every kernel the worker launches by name is in the cubin: a typo there would stop every GPU
call at the worker's start."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "evo" / "measure" / "cuda" / "support.cu"
WORKER = ROOT / "evo" / "measure" / "worker.py"


def test_support_kernels_compile_and_hold_every_kernel_the_worker_names():
    import cuda.pathfinder
    from cuda.core import Program, ProgramOptions

    inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
    opts = ProgramOptions(arch="sm_90a", std="c++17", include_path=[inc] if inc else [])
    cubin = Program(SUPPORT.read_text(), code_type="c++", options=opts).compile("cubin").code
    src = WORKER.read_text()
    named = set(re.findall(r'"(kf_[a-z0-9_]+)"', src))  # literal names: kf_hold, kf_poison, ...
    assert {"kf_hold", "kf_poison", "kf_offsets_i32"} <= named
    for k in sorted(named):
        assert k.encode() in cubin, k
    for prefix in set(re.findall(r'f"(kf_[a-z0-9_]+_)\{', src)):  # f"kf_fill_{SHORT[dtype]}" and the like
        assert any(f"{prefix}{s}".encode() in cubin for s in ("f32", "f16", "bf16")), prefix

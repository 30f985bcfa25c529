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


def test_every_op_device_reference_compiles_with_the_kernels_its_hooks_name():
    """Each op's float64 device reference (ops/<op>/device.cu) builds for sm_90a, and every kernel its
    reference() names for the op's matrix cells is in the cubin (the gate launches them by name)."""
    import importlib

    import cuda.pathfinder
    from cuda.core import Program, ProgramOptions

    from evo.core import contract, registry

    inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
    opts = ProgramOptions(arch="sm_90a", std="c++17", include_path=[inc] if inc else [])
    checked = 0
    for name in registry.KNOWN:
        if not contract.has_device_hooks(name):
            continue
        spec, mod = registry.get_op(name), importlib.import_module(f"ops.{name}.device")
        cubin = Program(mod.SOURCE.read_text(), code_type="c++", options=opts).compile("cubin").code
        for c in spec.matrix():
            for kernel, *_ in mod.reference(c.dims_dict(), c.dtypes_dict(), spec.scalar_values(c)):
                assert kernel.encode() in cubin, (name, c.label(), kernel)
        checked += 1
    assert checked >= 4

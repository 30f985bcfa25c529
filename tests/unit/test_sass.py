"""SASS on the CPU (evo/build/sass.py): real NVRTC builds for sm_90a disassembled by nvdisasm, their innermost loops
found and counted, and the scheduling bits ptxas writes (evo.build.sass.scheduled)."""

from __future__ import annotations

import io

import pytest

from evo.build.nvrtc import NVRTC_STD, include_dir
from evo.build.sass import SassError, disassemble, inner_loops, opcode

NESTED = r"""
extern "C" __global__ void nested(const float* __restrict__ x, float* __restrict__ y, int n) {
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float s = 0.f;
#pragma unroll 1
    for (int j = 0; j < 8; ++j) s += __expf(x[i * 8 + j]);
    y[i] = s;
  }
}
extern "C" __global__ void flat(float* __restrict__ y) { y[threadIdx.x] = 1.f; }
"""


def cubin(src: str) -> bytes:
    from cuda.core import Program, ProgramOptions

    opts = ProgramOptions(arch="sm_90a", std=NVRTC_STD, include_path=[include_dir()])
    return Program(src, code_type="c++", options=opts).compile("cubin", logs=io.StringIO()).code


def test_innermost_loop_of_a_real_build_is_found_and_counted():
    """The inner loop (one __expf: one MUFU, one global load) is found, not the outer one around it; a kernel
    without a loop has none; the kernels are told apart."""
    code = cubin(NESTED)
    lines = disassemble(code, "nested")
    assert lines and any(ln.endswith(":") for ln in lines) and any(opcode(ln) == "EXIT" for ln in lines)
    loops = inner_loops(lines)
    assert len(loops) == 1, loops  # the outer loop holds the inner one: not innermost; nor is the padding after EXIT
    (lp,) = loops
    assert lp.count("MUFU") == 1 and lp.count("LDG") == 1 and lp.count("STG") == 0  # y[i] is stored by the outer loop
    assert lp.size == sum(1 for ln in lines[lp.first:lp.last + 1] if not ln.endswith(":")) < len(lines)
    flat = disassemble(code, "flat")
    assert inner_loops(flat) == [] and not any(opcode(ln) == "MUFU" for ln in flat)


def test_opcode_strips_predicates_and_modifiers():
    assert opcode("@!P0 FMUL.FTZ R1, R2, R3") == "FMUL" and opcode("HMMA.1688.F32.TF32 R4, R8, R12, R4") == "HMMA"
    assert opcode("BRA `(.L_x_3)") == "BRA"


def test_a_kernel_not_in_the_cubin_is_a_clear_error():
    with pytest.raises(SassError, match="no kernel 'missing'"):
        disassemble(cubin(NESTED), "missing")


def test_build_point_refuses_an_illegal_point_by_name():
    """The scripts' build (evo.build.nvrtc.build_point): a point breaking a constraint is a ValueError naming it,
    before any compile."""
    from evo.build.nvrtc import build_point
    from evo.templates.template import load_templates
    from ops.kda.spec import prefill_matrix

    c = prefill_matrix()[0]
    with pytest.raises(ValueError, match="ex2_on_the_mma_prep"):
        build_point(load_templates("kda")["chunk"], {"prep_exp": "ex2"}, c.dtypes_dict(), c.dims_dict())


# ---- scheduling bits (evo.build.sass.scheduled, decode_control) and the recurrence's issue model -------------------

def test_control_bits_decode_from_the_upper_word():
    """nvdisasm's second word of three instructions of a real sm_90a build: S2R (variable latency: sets write
    scoreboard 1), the SHF that consumes its result (waits on scoreboard 1, 2 cycles), and an LDC that needs no
    scoreboard."""
    from evo.build.sass import Control, decode_control

    assert decode_control(0x000E620000002100) == Control(stall=1, yield_=True, write=1, read=None, wait=0, reuse=0)
    assert decode_control(0x002FE40000011400) == Control(stall=2, yield_=True, write=None, read=None, wait=0b10,
                                                         reuse=0)
    assert decode_control(0x000FE20000000800) == Control(stall=1, yield_=True, write=None, read=None, wait=0, reuse=0)
    assert decode_control(0x040FE400078EC0FF).reuse == 1  # LOP3.LUT R10, R0.reuse, ...: the first operand's flag


def test_scheduled_is_disassemble_with_bits_that_hang_together():
    """scheduled lists what disassemble lists, index for index; and in a real build every scoreboard an instruction
    waits for is one that some instruction of the kernel sets (as its write or read scoreboard), and stalls and masks
    are in range: the bits are where decode_control reads them."""
    from evo.build.sass import scheduled

    code = cubin(NESTED)
    sched = scheduled(code, "nested")
    assert [t for t, _ in sched] == disassemble(code, "nested")
    assert any(c is not None and c.write is not None for _, c in sched)
    waits = [(i, c.wait) for i, (_, c) in enumerate(sched) if c is not None and c.wait]
    assert waits
    set_anywhere = {b for _, c in sched if c is not None for b in (c.write, c.read) if b is not None}
    for i, mask in waits:
        assert all(b in set_anywhere for b in range(6) if mask >> b & 1), (i, sched[i])
    assert all((c.stall <= 15 and c.wait < 64) for _, c in sched if c is not None)


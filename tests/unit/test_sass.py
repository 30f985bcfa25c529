"""SASS on the CPU (evo/build/sass.py): real NVRTC builds for sm_90a disassembled by nvdisasm, their innermost loops
found and counted; and the KDA prep's claim read from its SASS (experiments/scripts/prep_sass.py): prep_exp = ex2
drops __expf's subnormal guard, and with prep_addr = rowcol every hot loop the estimate counts gets shorter and
prep_vec's 16-byte stores become STG.E.128 (four 32-bit stores each without it); and the K-split recurrence's chunk loop
with recur_addr = hoist or carry (experiments/scripts/recur_sass.py) keeps its mma and copies and loses integer instructions;
and the scheduling bits ptxas writes (evo.build.sass.scheduled)."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from evo.build.nvrtc import NVRTC_STD, include_dir
from evo.build.sass import SassError, disassemble, inner_loops, opcode

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("prep_sass", ROOT / "experiments" / "scripts" / "prep_sass.py")
assert _spec and _spec.loader
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

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


def test_prep_ex2_and_rowcol_shorten_every_hot_loop():
    """kda_prefill_h200_13's dispatch prep at 128 threads: the fast build guards each __expf against a subnormal
    result (a compare with -126), the ex2 builds have no such compare; every role of the estimate is found in every
    build (the diagonal and the off-diagonal A loops), and ex2 with rowcol needs fewer instructions than fast with swz
    in each of them. (prep_sass.py's variants of prep options the template no longer has are left out.)"""
    from evo.templates.template import load_templates
    from ops.kda.spec import prefill_matrix

    tdef = load_templates("kda")["chunk"]
    c = prefill_matrix()[0]
    table = json.loads((ROOT / "tests/fixtures/results/kda_prefill_h200_13/dispatch.json").read_text())["dispatch"]
    base = table[c.label()]["params"]
    got = {name: P.build(tdef, c, base | over) for name, over in P.VARIANTS.items() if set(over) <= set(tdef.param_names)}
    assert {"fast-swz", "ex2-swz", "ex2-rowcol", "ex2-rowcol-bf16wu-vlate"} <= set(got)
    elementwise = {"qg", "kgT", "X", "scan"}
    for name, r in got.items():
        assert set(r["roles"]) == elementwise | {"diagonal k-step", "off-diagonal k-step"}, (name, sorted(r["roles"]))
        assert r["spill_stores"] == 0 and r["stack_bytes"] == 0, name
    fast, both = got["fast-swz"]["roles"], got["ex2-rowcol"]["roles"]
    for role in fast:
        assert both[role]["instructions"] / both[role].get("exponentials", 1) < \
            fast[role]["instructions"] / fast[role].get("exponentials", 1), role
    est = {name: r["estimated_warp_instructions_a_cta"] for name, r in got.items()}
    assert est["ex2-rowcol"] < 0.7 * est["fast-swz"]
    from evo.build.nvrtc import build_point

    for name, guard, wide_stores in (("fast-swz", True, False), ("ex2-swz", False, False), ("ex2-rowcol", False, True)):
        built = build_point(tdef, base | P.VARIANTS[name], c.dtypes_dict(), c.dims_dict())
        lines = disassemble(built.cubin, "kda_chunk_prep")
        assert any(opcode(ln) == "FSETP" and "-126" in ln for ln in lines) == guard, name
        # prep_vec's uint4 stores through the bf16 pointer come out as four 32-bit STG.E each; indexed as uint4
        # (rowcol) as one STG.E.128, q exp(G)'s and k exp(G_last - G)'s
        assert sum("STG.E.128" in ln for ln in lines) >= (2 if wide_stores else 0), name
        assert wide_stores or not any("STG.E.128" in ln for ln in lines), name


def test_build_point_refuses_an_illegal_point_by_name():
    """The scripts' build (evo.build.nvrtc.build_point): a point breaking a constraint is a ValueError naming it,
    before any compile."""
    from evo.build.nvrtc import build_point
    from evo.templates.template import load_templates
    from ops.kda.spec import prefill_matrix

    c = prefill_matrix()[0]
    with pytest.raises(ValueError, match="ex2_on_the_mma_prep"):
        build_point(load_templates("kda")["chunk"], {"prep_exp": "ex2"}, c.dtypes_dict(), c.dims_dict())


_rspec = importlib.util.spec_from_file_location("recur_sass", ROOT / "experiments" / "scripts" / "recur_sass.py")
assert _rspec and _rspec.loader
R = importlib.util.module_from_spec(_rspec)
_rspec.loader.exec_module(R)


def test_recur_addr_hoist_and_carry_shorten_the_split_k_chunk_loop():
    """recur_addr = hoist, then carry (kda_prefill_h200_15's K-split dispatch points, B1-T8192 and B1-T32768): the
    chunk loop keeps its mma, ldmatrix and cp.async counts and loses integer instructions (hoist: no chunk % NS, no
    per-address swizzle; carry: no 64-bit source address or o address built a chunk, no select of a warp's own
    partial), without spills and with no more registers. NVRTC 13.5 when written: 525 -> 439 -> 366 instructions at
    kwarps 2, 450 -> 395 -> 311 at kwarps 4 (recur_sass.json, in git history)."""
    from evo.build.nvrtc import build_point
    from evo.templates.template import load_templates
    from evo.core.registry import get_op

    tdef = load_templates("kda")["chunk"]
    table = json.loads((ROOT / "tests/fixtures/results/kda_prefill_h200_15/dispatch.json").read_text())["dispatch"]
    cells = {c.label(): c for c in get_op("kda").all_cells()}
    ksplit = {label: e["params"] for label, e in table.items() if e["params"]["kwarps"] > 1}
    assert len(ksplit) == 2
    for label, params in sorted(ksplit.items()):
        c = cells[label]
        got = {}
        for addr in ("swz", "hoist", "carry"):
            r = build_point(tdef, params | {"recur_addr": addr}, c.dtypes_dict(), c.dims_dict())
            res = dict(r.resources)["kda_chunk_recur"]
            assert r.status.ok and res.spill_stores == res.spill_loads == res.stack_bytes == 0, (addr, res)
            lp = R.chunk_loop(inner_loops(disassemble(r.cubin, "kda_chunk_recur")))
            got[addr] = (res.regs, lp)
        integer = {k: sum(n for o, n in lp.ops if o in R.INTEGER) for k, (_, lp) in got.items()}
        for before, after, share in (("swz", "hoist", 0.85), ("hoist", "carry", 0.6)):
            (r0, a), (r1, b) = got[before], got[after]
            for op in ("HMMA", "LDSM", "LDGSTS", "BAR"):
                assert a.count(op) == b.count(op) > 0, (label, after, op)
            assert integer[after] <= share * integer[before] and b.size < a.size and r1 <= r0, (label, after, integer)
        # carry reads every partial back (its own too) instead of selecting its own by warp: no more shared loads
        assert got["carry"][1].count("LDS") <= got["hoist"][1].count("LDS"), label


def test_recur_addr_carry_shortens_the_one_warp_chunk_loop():
    """recur_addr = carry on kda_prefill_h200_15's one-warp-a-column dispatch point (B4-T4096 and B8-T2048: recur_lean,
    recur_ldsm, u_prefetch, warps 2, stages 6): the same mma, ldmatrix, cp.async and barrier counts a chunk, at least
    40% fewer integer instructions (no item % NS in any address, no 64-bit source built a refill), no spill. NVRTC 13.5
    when written: 624 -> 518 instructions a warp, 220 -> 109 integer (recur_sass.json, in git history)."""
    from evo.build.nvrtc import build_point
    from evo.templates.template import load_templates
    from evo.core.registry import get_op

    tdef = load_templates("kda")["chunk"]
    table = json.loads((ROOT / "tests/fixtures/results/kda_prefill_h200_15/dispatch.json").read_text())["dispatch"]
    cells = {c.label(): c for c in get_op("kda").all_cells()}
    one = {label: e["params"] for label, e in table.items() if e["params"]["kwarps"] == 1}
    assert len(one) == 2 and all(p["recur_lean"] and p["recur_ldsm"] for p in one.values())
    label = min(one)
    c = cells[label]
    got = {}
    for addr in ("swz", "carry"):
        r = build_point(tdef, one[label] | {"recur_addr": addr}, c.dtypes_dict(), c.dims_dict())
        res = dict(r.resources)["kda_chunk_recur"]
        assert r.status.ok and res.spill_stores == res.spill_loads == res.stack_bytes == 0, (addr, res)
        got[addr] = R.chunk_loop(inner_loops(disassemble(r.cubin, "kda_chunk_recur")))
    a, b = got["swz"], got["carry"]
    for op in ("HMMA", "LDSM", "LDGSTS", "BAR"):
        assert a.count(op) == b.count(op) > 0, op
    integer = {k: sum(n for o, n in lp.ops if o in R.INTEGER) for k, lp in got.items()}
    assert integer["carry"] <= 0.6 * integer["swz"] and b.size < 0.9 * a.size, (integer, a.size, b.size)


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


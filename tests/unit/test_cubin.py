"""evo/build/cubin.py against real NVRTC builds (no GPU): the registers read from a cubin's .nv.info agree with
ptxas's own report for every kernel of several templates, and compile_one falls back to them when no report comes
back. And evo/build/nvrtc.parse_ptxas with out-of-line device functions in the report."""

from __future__ import annotations

import pytest

import evo.build.nvrtc as nvrtc
from evo.build.cubin import CubinError, cubin_regcounts
from evo.build.nvrtc import compile_one, parse_ptxas, prepare
from evo.core.genome import Genome
from evo.templates.template import load_templates
from ops.kda.spec import prefill_matrix
from ops.rmsnorm.spec import cell as rms_cell

# chunk 32, kwarps 2, the mma prep, overlap: three kernels, and two device functions ptxas keeps out of line
KDA_OVERLAP = {"chunk": 32, "stages": 3, "prep_threads": 128, "stage_in": True, "prep_diag": "mma", "prep_round": "add",
               "prep_exp": "fast", "prep_vec": True, "kwarps": 2, "overlap": True, "warps": 2}


def _build(op: str, template: str, params: dict, c):
    tdef = load_templates(op)[template]
    g = Genome.make(op, template, tdef.source_hash, tdef.default_params() | params)
    return prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict())


BUILDS = {
    "rmsnorm-warp_row": ("rmsnorm", "warp_row", {}, rms_cell("bfloat16", 4096, 4096)),
    "kda-chunk-overlap": ("kda", "chunk", KDA_OVERLAP, [c for c in prefill_matrix() if c.dim("B") == 1][0]),
    "kda-chunk-default": ("kda", "chunk", {}, prefill_matrix()[0]),
}


@pytest.fixture(scope="module", params=list(BUILDS))
def built(request):
    op, template, params, c = BUILDS[request.param]
    bi = _build(op, template, params, c)
    r = compile_one(bi)
    assert r.status.ok, r.error
    return bi, r


def test_the_cubin_gives_the_registers_ptxas_reported_for_every_kernel(built):
    bi, r = built
    reported = {k: res.regs for k, res in r.resources}
    assert reported and all(n > 0 for n in reported.values())
    assert cubin_regcounts(r.cubin) == reported


def test_without_a_ptxas_report_the_build_takes_its_registers_from_the_cubin(built, monkeypatch):
    bi, r = built
    monkeypatch.setattr(nvrtc, "parse_ptxas", lambda log: {})
    r2 = compile_one(bi)
    assert r2.status.ok
    assert {k: res.regs for k, res in r2.resources} == {k: res.regs for k, res in r.resources}
    assert r2.regs == r.regs > 0


@pytest.mark.parametrize("junk, why", [(b"", "not a 64-bit"), (b"\x7fELF" + b"\x01" * 60, "not a 64-bit"),
                                       (b"PK\x03\x04" + b"\0" * 100, "not a 64-bit")])
def test_bytes_that_are_not_a_cubin_are_refused(junk, why):
    with pytest.raises(CubinError, match=why):
        cubin_regcounts(junk)


def test_a_truncated_cubin_is_refused(built):
    _, r = built
    with pytest.raises(CubinError, match="past the end"):
        cubin_regcounts(r.cubin[: len(r.cubin) // 2])


# ptxas's report of a program whose entries call device functions it kept out of line (kda chunk with overlap, as
# NVRTC 13.5 printed it): each "Function properties for" line names whose frame line follows
LOG = """ptxas info    : 12 bytes gmem
ptxas info    : Compiling entry function 'kda_chunk_recur' for 'sm_90a'
ptxas info    : Function properties for kda_chunk_recur
ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 198 registers, used 16 barriers, 64 bytes cumulative stack size
ptxas info    : Compile time = 69.691 ms
ptxas info    : Function properties for _Z10varlen_rowPKii
ptxas         .     0 bytes stack frame, {st} bytes spill stores, {ld} bytes spill loads
ptxas info    : Compiling entry function 'kda_chunk_prep' for 'sm_90a'
ptxas info    : Function properties for kda_chunk_prep
ptxas         .     0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 95 registers, used 1 barriers
"""


def test_a_device_functions_frame_does_not_overwrite_its_entrys():
    r = parse_ptxas(LOG.format(st=0, ld=0))
    assert r["kda_chunk_recur"] == nvrtc.KernelResources(regs=198, stack_bytes=64)
    assert r["kda_chunk_prep"] == nvrtc.KernelResources(regs=95, spill_stores=8, spill_loads=4)
    assert set(r) == {"kda_chunk_recur", "kda_chunk_prep"}  # the device function is not a kernel


def test_a_device_functions_spills_count_against_every_entry():
    r = parse_ptxas(LOG.format(st=16, ld=24))
    assert (r["kda_chunk_recur"].spill_stores, r["kda_chunk_recur"].spill_loads) == (16, 24)
    assert (r["kda_chunk_prep"].spill_stores, r["kda_chunk_prep"].spill_loads) == (8 + 16, 4 + 24)
    assert r["kda_chunk_recur"].stack_bytes == 64


def test_resources_of_bytes_that_are_not_a_cubin_are_unknown_not_an_error():
    assert nvrtc.resources_of("", b"not a cubin") == {}
    assert nvrtc.resources_of("", b"") == {}


def test_a_cubin_whose_names_run_past_its_end_is_refused(built):
    """Section headers intact, the string table's offset pointing past the end: refused by name, not an IndexError."""
    import struct

    _, r = built
    b = bytearray(r.cubin)
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, _, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    at = shoff + shstrndx * shentsize + 24  # sh_offset of the section-name table
    struct.pack_into("<Q", b, at, len(b) - 1)
    struct.pack_into("<Q", b, at + 8, 0)  # sh_size 0: the header check passes, the names do not
    with pytest.raises(CubinError):
        cubin_regcounts(bytes(b))

"""Builds with another NVRTC than the venv's: the H200 image builds with NVRTC 13.0, this venv may hold a
newer one, and a template can compile under one and not the other (docs/nvrtc_13_0.md: NVRTC 13.0 refused
recur_lean's generic lambda). The summary of a failed build names NVRTC's diagnostic, not its result line.

The builds under another NVRTC are opt-in: KF_NVRTC_ALT names a folder holding it (one of the layouts of
evo.build.nvrtc_lib.find_nvrtc), e.g.
    pip install --no-deps --target /tmp/nvrtc130 "nvidia-cuda-nvrtc==13.0.*"
    KF_NVRTC_ALT=/tmp/nvrtc130 python -m pytest -q tests/unit/test_nvrtc_alt.py"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evo.build.nvrtc import Builder, _first_error, prepare
from evo.build.nvrtc_lib import find_nvrtc
from evo.core.genome import Genome
from evo.templates.template import load_templates
from ops.kda.spec import cell
from evo.core.spec import Cell, DType

ALT = os.environ.get("KF_NVRTC_ALT", "")
BF = DType.BF16
CHUNK = load_templates("kda")["chunk"]
RECURRENT = load_templates("kda")["recurrent"]

# ---- the summary of a failed build -----------------------------------------------------------------

# NVRTC 13.0's log of the generic lambda (as cuda.core's NVRTCError words it), abridged
LOG_13_0 = """6: NVRTC_ERROR_COMPILATION, compilation log:

default_program(499): error: A function without execution space annotations (__host__/__device__/__global__) is \
considered a host function, and host functions are not allowed in JIT mode. Consider using -default-device flag to \
process unannotated functions as __device__ functions in JIT mode
    auto issue_k = [&](auto kind_c, int it) {
                      ^

default_program(87): warning #177-D: function "<unnamed>::warp_sum" was declared but never referenced

1 error detected in the compilation of "default_program".
"""


@pytest.mark.parametrize("log, want", [
    (LOG_13_0, "default_program(499): error: A function without execution space annotations"),
    ("6: NVRTC_ERROR_COMPILATION, compilation log:\n\nptxas error   : Entry function 'k' uses too much shared data",
     "ptxas error   : Entry function 'k' uses too much shared data"),
    ("6: NVRTC_ERROR_COMPILATION, compilation log:\n\ndefault_program(3): error #20: identifier \"x\" is undefined",
     "default_program(3): error #20: identifier \"x\" is undefined"),
    ("7: NVRTC_ERROR_INVALID_OPTION, compilation log:\n\nnvrtc: error: invalid value for --gpu-architecture (-arch)",
     "nvrtc: error: invalid value for --gpu-architecture (-arch)"),
    ("6: NVRTC_ERROR_COMPILATION, compilation log:\n\n", "6: NVRTC_ERROR_COMPILATION, compilation log:"),
    ("", "compile failed with an empty log"),
], ids=["diagnostic", "ptxas", "numbered", "option", "result-only", "empty"])
def test_first_error_names_the_diagnostic_not_nvrtcs_result_line(log: str, want: str):
    """The H200's reports said only "6: NVRTC_ERROR_COMPILATION, compilation log:" (read as an empty log): the
    summary took the first line with "error" in it, NVRTC's result line, while the log held the diagnostic."""
    assert _first_error(log).startswith(want)


# ---- builds with KF_NVRTC_ALT's NVRTC --------------------------------------------------------------

alt = pytest.mark.skipif(not ALT, reason="KF_NVRTC_ALT names no folder with another NVRTC (e.g. pip install "
                         "--no-deps --target /tmp/nvrtc130 'nvidia-cuda-nvrtc==13.0.*'; KF_NVRTC_ALT=/tmp/nvrtc130)")

# the lean recurrence NVRTC 13.0 refused on the H200 (B1-H32-T8192) before docs/nvrtc_13_0.md's fix (there beside the
# split diagonal, a prep option since removed)
LEAN_H200 = {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True, "recur_lean": True}
PREFILL = cell(BF, 1, 8192, 32)
VARLEN = cell(BF, 1, 8192, 32, n=8)
CHUNK_POINTS = [  # (cell, params over the defaults)
    (PREFILL, {}),
    (PREFILL, LEAN_H200),
    (PREFILL, LEAN_H200 | {"recur_lean": False}),
    (PREFILL, LEAN_H200 | {"recur_ldsm": True}),  # recur_ldsm: the B fragments by ldmatrix (the point it is for)
    (PREFILL, LEAN_H200 | {"recur_lean": False, "recur_ldsm": True}),
    (PREFILL, LEAN_H200 | {"recur_ldsm": True, "recur_fuse": True}),  # recur_fuse: items 0 and 1 as one
    (PREFILL, {"chunk": 64, "warps": 2, "stages": 3, "stage_in": True, "u_prefetch": False, "recur_lean": True}),
    (PREFILL, {"chunk": 32, "warps": 8, "stages": 3, "state_split": True, "recur_lean": True}),
    (PREFILL, LEAN_H200 | {"recur_ldsm": True, "recur_addr": "carry"}),  # carry: the items' slots, sources carried
    (PREFILL, {"chunk": 32, "warps": 1, "stages": 3, "stage_in": True, "kwarps": 2, "recur_addr": "carry"}),
    # recur_early: the refill without a branch, u and exp(G_last) read first (at kwarps 4 and a 6-deep ring, carry
    # without it spills 8 B under 13.0: recur_sass_nvrtc13_0.json, in git history)
    (PREFILL, {"chunk": 32, "warps": 1, "stages": 3, "stage_in": True, "kwarps": 2, "recur_addr": "carry",
               "recur_early": "mid"}),
    (PREFILL, {"chunk": 32, "warps": 1, "stages": 6, "stage_in": True, "kwarps": 4, "recur_addr": "carry",
               "recur_early": "late"}),
    # the bf16 w, u prep on the K-split carry recurrence
    (PREFILL, {"chunk": 32, "warps": 1, "stages": 3, "stage_in": True, "kwarps": 2, "recur_addr": "carry",
               "recur_early": "late", "prep_diag": "mma", "prep_exp": "ex2", "prep_addr": "rowcol", "prep_round": "add",
               "prep_vec": True, "prep_threads": 128, "prep_wu": "bf16"}),
    # prep_v = late: v staged over q after the A phase, 6 CTAs an SM asked for (80 registers at most)
    (PREFILL, {"chunk": 32, "warps": 1, "stages": 3, "stage_in": True, "kwarps": 2, "recur_addr": "carry",
               "recur_early": "late", "prep_diag": "mma", "prep_exp": "ex2", "prep_addr": "rowcol", "prep_round": "add",
               "prep_vec": True, "prep_threads": 128, "prep_wu": "bf16", "prep_v": "late"}),
    (VARLEN, LEAN_H200),
    (VARLEN, LEAN_H200 | {"recur_ldsm": True}),
    (VARLEN, {"chunk": 32, "stage_in": True, "prep_threads": 256, "recur_lean": True, "state_split": True,
              "u_prefetch": False}),
]


@pytest.fixture(scope="module")
def alt_version() -> str:
    return find_nvrtc(Path(ALT)).version


def build_alt(jobs: list[tuple[str, Cell, dict]]) -> list:
    bis = []
    for name, c, p in jobs:
        t = load_templates("kda")[name]
        assert t.is_valid(p, 90, c.dtypes_dict(), c.dims_dict()), (name, c.label(), p)
        bis.append(prepare(t, Genome.make("kda", name, t.source_hash, p), "sm_90a", c.dtypes_dict(), c.dims_dict()))
    with Builder(2, nvrtc=ALT, timeout_s=300) as b:
        return b.build(bis)


@alt
def test_kda_chunk_points_compile_clean_with_the_alt_nvrtc(alt_version: str):
    """The handful of chunk points (recur_lean, recur_ldsm, recur_fuse, recur_addr carry among them, a varlen cell)
    build with KF_NVRTC_ALT's NVRTC, OK, without static smem, at most 255 registers, and with no spill or stack but in
    a prep of 256 threads (at most 160 B, pinned_spill's bound under 13.5: NVRTC 13.0 spilled 64-88 B in such preps
    where 13.5 did not); every recurrence builds spill-free."""
    jobs = [("chunk", c, CHUNK.default_params() | p) for c, p in CHUNK_POINTS]
    for (_, c, p), r in zip(jobs, build_alt(jobs)):
        assert r.compiler == alt_version
        assert r.status.ok, (c.label(), p, r.error, r.log[:2000])
        assert {k for k, _ in r.resources} == {"kda_chunk_prep", "kda_chunk_recur"}
        for kernel, res in r.resources:
            bound = 160 if kernel == "kda_chunk_prep" and p["prep_threads"] == 256 else 0
            assert max(res.spill_stores, res.spill_loads, res.stack_bytes) <= bound, (p, kernel, res)
            assert res.smem_bytes == 0 and res.regs <= 255, (p, kernel, res)


@alt
def test_kda_recurrent_default_compiles_with_the_alt_nvrtc(alt_version: str):
    c = cell(BF, 16, 1, 32)
    r, = build_alt([("recurrent", c, RECURRENT.default_params())])
    assert r.compiler == alt_version and r.status.ok, (r.error, r.log[:2000])
    assert r.spill_stores == 0 and r.stack_bytes == 0

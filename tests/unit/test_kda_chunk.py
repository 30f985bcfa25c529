"""KDA chunked prefill on the CPU: the chunk template compiles with real NVRTC for sm_90a on the prefill
cells and their gate cells without spills, refuses what it does not implement, and a numpy emulation
of its algorithm (same chunking, workspace layout and precision: fp32 cumulative decay and forward
substitution, exact fp32 diagonal blocks, tf32 products in the first launch, bf16 operands with fp32
accumulation in the second) matches the float64 reference within the spec's tolerance on every kind;
the real gate runs the two launches, emulated, on the numpy fake device. Of the options, stage_in (launch 1
reads q, k, v, beta from a staged smem copy) and u_prefetch (launch 2 loads u a chunk ahead) change no
arithmetic, so the emulation stands for them unchanged; prep_exp = fast (__expf in launch 1) is emulated
at the edge of its documented error. With all three off the template renders the code it had before
they existed, and every kernel they add builds without spills. fla's variants (raw gate on fp32 or bf16 g, beta
logits, in-kernel q/k L2 norm, V-first state) are compile-time consts: the emulation forms them as launch 1
does (variant_prep) and matches the reference on each, the model's varlen call included, which builds clean."""

from __future__ import annotations

from pathlib import Path

import random
import re
import gzip
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from itertools import product

import numpy as np
import pytest

from evo.build.nvrtc import MAX_SMEM_PER_BLOCK, prepare
from tests.unit.nvrtc_memo import compile_memo, compile_threads
from evo.core.genome import Genome
from evo.templates.render import render
from evo.templates.template import TemplateDef, load_templates
from ops.kda import SPEC
from ops.kda.reference import BetaAct, Gate, Variant
from ops.kda.spec import FILLS, LOWER_BOUND, MODEL, PREFILL, cell, gate_cells, is_varlen, raw_gate, variant_of
from evo.core.spec import Cell, DType, Tolerance
from ops.kda import emulate_chunk
from ops.kda.emulate_chunk import (DIAG_RANGE, LOG2E, diag_is_wide, emulate, emulate_cell, emulate_prep, emulate_recur,
                                   emulate_varlen, variant_prep, varlen_slots)
from tests.unit.test_kda_recurrent import KdaFakeDevice, emulation_inputs, gate_on_fake, passes

BF, FP16, FP32 = DType.BF16, DType.FP16, DType.FP32
TDEF = load_templates("kda")["chunk"]
PREFILL_CELLS = SPEC.matrices["prefill"]()
ARCH = 90
f32 = np.float32


def compile_point(c: Cell, params: dict):
    g = Genome.make("kda", "chunk", TDEF.source_hash, params)
    return compile_memo(prepare(TDEF, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))


def compile_clean(c: Cell, points: list[dict]) -> list[dict]:
    """NVRTC builds of `points` on c (compile_threads() at a time: NVRTC releases the GIL), each asserted OK without spills or
    stack but the pinned ones (pinned_spill), and without static smem (all of it dynamic: the plan's smem is the
    whole); each point's {kernel: resources}."""
    results = [compile_point(c, points[0])]  # the first alone: cuda.core's lazy import is not thread-safe
    with ThreadPoolExecutor(compile_threads()) as pool:
        results += pool.map(lambda p: compile_point(c, p), points[1:])
    out = []
    for p, r in zip(points, results):
        assert r.status.ok, (p, r.error)
        assert_spills_pinned(c, p, r)
        for kernel, res in r.resources:
            assert res.smem_bytes == 0, (p, kernel, res)
        out.append(dict(r.resources))
    return out


def legal_points(c: Cell, n: int, seed: int = 0) -> list[dict]:
    """n distinct legal parameter points on c (the default first), drawn from the declared space."""
    rng = random.Random(seed)
    out = [TDEF.default_params()]
    for _ in range(20000):
        if len(out) == n:
            break
        # recur_lean, recur_ldsm, recur_fuse (last in the space) left off: the draws of the other keys as before they
        # existed (their own builds: test_recur_{lean,ldsm,fuse}_points_compile_without_spills)
        # kwarps (launch 2 with K split across warps) left at 1 too: its own tests are test_kwarps_*
        p = {k: rng.choice(v) for k, v in TDEF.space if k not in ("recur_lean", "recur_ldsm", "recur_fuse", "kwarps")} | {
            "recur_lean": False, "recur_ldsm": False, "recur_fuse": False, "kwarps": 1}
        if p not in out and TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()):
            out.append(p)
    return out


def covering(points: list[dict], *keys, start: tuple[dict, ...] = ()) -> list[dict]:
    """A deterministic subset of `points` (after `start`, kept first) in which every value each key takes on `points`
    appears at least once: greedily the point adding the most values not yet held (the first of a tie). A key is a
    param name or a function of the point (None: the point does not count for it). A compile sweep builds this subset
    rather than every point: every value of every option it varies is still built at least once."""
    fns = [(lambda p, k=k: p[k]) if isinstance(k, str) else k for k in keys]

    def feats(p: dict) -> set:
        return {(i, f(p)) for i, f in enumerate(fns) if f(p) is not None}

    todo = set().union(*map(feats, points)) - set().union(set(), *map(feats, start))
    out = list(start)
    while todo:
        p = max(points, key=lambda q: len(feats(q) & todo))
        todo -= feats(p)
        out.append(p)
    return out


# ---- NVRTC ---------------------------------------------------------------------------------------

def test_prefill_matrix_is_what_the_template_serves():
    """The named matrix "prefill" is the op matrix's fla-default multi-token cells, all admitted."""
    assert [(c.dim("B"), c.dim("T"), c.dim("H")) for c in PREFILL_CELLS] == list(PREFILL)
    assert PREFILL_CELLS == [c for c in SPEC.matrix() if c.dim("T") > 1 and not is_varlen(c)]
    for c in PREFILL_CELLS:
        assert TDEF.violations(TDEF.default_params(), ARCH, c.dtypes_dict(), c.dims_dict()) == []
        for gc in gate_cells(c):  # T = 1 and T = 3: partial chunks
            assert TDEF.is_valid(TDEF.default_params(), ARCH, gc.dtypes_dict(), gc.dims_dict()), gc.label()


# The builds that spill, pinned where found rather than hidden (ptxas prints an out-of-line device function's
# properties inside its caller's block; the parser keeps the entry's): a template change that spills more, or spills
# anywhere else, fails. Stores / loads / stack bytes under NVRTC 13.5 (chunk_spills.json in git history):
# - the prep at 256 threads under a register cap: at chunk 64 (128 registers: 88 / 84 / 64, and 108 / 136 / 88 with
#   q, k normalized in the kernel), and at chunk 32 with fla's variants in the kernel (80 registers: 64 / 72 under
#   NVRTC 13.0; none under 13.5);
# - the split-K recurrence (kwarps > 1) at 512 threads (128 registers: 72 / 72 / 72 at warps 8, kwarps 2) and at
#   chunk 64 (255 registers: 76 / 76 / 80);
# - the lean one-warp recurrence with the split state at stages 4 (255 registers: 24 / 24 / 24).
def pinned_spill(c: Cell, p: dict, kernel: str) -> int:
    """The most spill bytes (stores, loads and stack, each) a kernel of point p on cell c may have."""
    if kernel == "kda_chunk_prep":
        if p["prep_threads"] != 256:
            return 0
        variants = any(c.dim(d) for d in ("gate", "beta_act", "qk_l2norm"))
        return 160 if p["chunk"] == 64 or variants else 0
    if p.get("kwarps", 1) > 1:
        return 96 if 32 * p["warps"] * p["kwarps"] >= 512 else 0  # chunk 64's spilling kwarps 2: refused
    return 32 if p.get("recur_lean") and p.get("state_split") and p["stages"] >= 4 else 0


def assert_spills_pinned(c: Cell, p: dict, r) -> None:
    for kernel, res in r.resources:
        bound = pinned_spill(c, p, kernel)
        assert max(res.spill_stores, res.spill_loads, res.stack_bytes) <= bound, (p, kernel, res)


@pytest.mark.parametrize("chunk", [32, 64])
def test_default_point_compiles_without_spills_but_the_pinned_ones(chunk: int):
    p = TDEF.default_params() | {"chunk": chunk}
    r = compile_point(PREFILL_CELLS[0], p)
    assert r.status.ok, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF" and "sm_90a" in r.log
    assert {k for k, _ in r.resources} == {"kda_chunk_prep", "kda_chunk_recur"}
    assert_spills_pinned(PREFILL_CELLS[0], p, r)
    plan, _ = TDEF.plan(TDEF.default_params() | {"chunk": chunk}, 90, PREFILL_CELLS[0].dtypes_dict(),
                        PREFILL_CELLS[0].dims_dict())
    assert [ln.kernel for ln in plan] == ["kda_chunk_prep", "kda_chunk_recur"]  # overlap off: the two launches
    for kernel in ("kda_chunk_prep", "kda_chunk_recur"):
        assert kernel in r.log


def test_legal_points_compile_without_spills_but_the_pinned_ones():
    """A sample of the space (both chunk sizes, every warps count, the split state) stays off the spill path, but
    for the pinned prep at chunk 64 and 256 threads (pinned_spill): the sample's points that hold every value it
    draws (covering) are built."""
    c = PREFILL_CELLS[2]
    points = legal_points(c, 10, seed=1) + [TDEF.default_params() | q for q in (
        {"chunk": 64, "prep_threads": 128, "warps": 8, "stages": 3, "state_split": False},
        {"chunk": 32, "prep_threads": 128, "warps": 8, "stages": 6, "state_split": True},
        {"chunk": 32, "prep_threads": 256, "warps": 2, "stages": 6, "state_split": False},
    )]
    for p in points:
        assert TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()), p
    for p in covering(points, *TDEF.param_names):
        r = compile_point(c, p)
        assert r.status.ok, (p, r.error)
        assert_spills_pinned(c, p, r)


def test_plans_fit_the_launch_limits():
    """Dynamic smem within a block's opt-in limit (the worker opts every launch with dynamic smem in), the
    recurrence's ring within 48 KB as its constraint says; workspace sized per chunk."""
    for c in PREFILL_CELLS:
        for p in legal_points(c, 12, seed=2):
            launches, ws = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
            assert launches[0].smem <= MAX_SMEM_PER_BLOCK and launches[1].smem <= 48 * 1024, p
            assert launches[0].grid == (-(-c.dim("T") // p["chunk"]), c.dim("HV"), c.dim("B"))
            n = c.dim("B") * c.dim("HV") * -(-c.dim("T") // p["chunk"])
            assert ws["ws_u"] == 4 * n * p["chunk"] * c.dim("V") and ws["ws_gl"] == 4 * n * c.dim("K")


@pytest.mark.parametrize("c, why", [
    (cell(FP16, 2, 64, 2), "bf16_activations"),
    (cell(BF, 2, 64, 2, g=BF), "fp32_log_decay"),  # a log-space g summed over the chunk: fp32 only
    (cell(BF, 2, 64, 2, g=FP16, variant=Variant(Gate.SOFTPLUS)), "fp32_log_decay"),  # a raw g: fp32 or bf16
    (cell(BF, 2, 64, 2, state=BF), "fp32_state"),
    (cell(BF, 2, 64, 2, 64, 128), "k_is_128"),
    (cell(BF, 1, 8192, 32, n=8, g=BF, state=BF, variant=MODEL), "fp32_state"),
], ids=lambda v: v if isinstance(v, str) else v.label())
def test_unimplemented_variants_are_refused_by_constraints(c: Cell, why: str):
    assert why in TDEF.violations(TDEF.default_params(), ARCH, c.dtypes_dict(), c.dims_dict())


# ---- the options: stage_in and prep_exp (launch 1), u_prefetch (launch 2) -----------------------------

OPTIONS = {"u_prefetch": False, "stage_in": False, "prep_exp": "expf", "prep_diag": "warp_row", "recur_lean": False,
           "recur_ldsm": False, "recur_fuse": False, "prep_round": "cvt", "prep_vec": False, "kwarps": 1,
           "overlap": False, "prep_addr": "swz", "recur_addr": "swz", "prep_wu": "tf32", "recur_early": "none",
           "prep_v": "early"}  # each option's off value: the code without it


# The space before the options (its 96 points with every option off: the "options" pin of the golden table).
OLD_SPACE = {"chunk": [32, 64], "prep_threads": [128, 256], "warps": [1, 2, 4, 8], "stages": [3, 4, 6],
             "state_split": [False, True]}


def source(t: TemplateDef, c: Cell, p: dict) -> str:
    r = render(t, p, ARCH, c.dtypes_dict(), t.consts(c.dims_dict()))
    assert r.status.ok, r.error
    return r.source


_LEGAL: dict[tuple, list[dict]] = {}


def all_legal(c: Cell, t: TemplateDef = TDEF, ksplit: bool = False) -> list[dict]:
    """Every legal point of t's space on c (computed once a cell and template; each call gets fresh dicts), at
    kwarps 1 (the one-warp-a-column recurrence the earlier options' tests count), with ksplit also at kwarps 2, 4.
    Those are enumerated with the one-warp-a-column options off: every other value is refused there
    (ksplit_is_its_own_recurrence, test_kwarps_legality), and the product stays the size it had before kwarps."""
    key = (c.label(), t.source_hash, ksplit)
    if key not in _LEGAL:
        names = t.param_names
        fixed = [{"kwarps": 1}] if "kwarps" in names else [{}]
        if ksplit and "kwarps" in names:
            fixed += [{"kwarps": k} | {o: False for o in ONE_WARP_OPTIONS} for k in t.values("kwarps") if k > 1]
        if "overlap" in names:  # the launches in order (the overlap's points: test_overlap_legality)
            fixed = [f | {"overlap": False} for f in fixed]
        if "recur_addr" in names:  # the K-split recurrence's addresses as before (test_recur_addr_legality)
            fixed = [f | {"recur_addr": "swz"} for f in fixed]
        if "prep_wu" in names:  # w, u by tf32 mma as before (test_prep_wu_legality)
            fixed = [f | {"prep_wu": "tf32"} for f in fixed]
        if "recur_early" in names:  # the K-split recurrence's loads and refill as before (test_recur_early_legality)
            fixed = [f | {"recur_early": "none"} for f in fixed]
        if "prep_v" in names:  # v staged with q and k as before (test_prep_v_legality)
            fixed = [f | {"prep_v": "early"} for f in fixed]
        out = []
        for f in fixed:  # TemplateDef.legal_points: the brute force's set (tests/unit/test_template_legal_points.py)
            out += t.legal_points(ARCH, c.dtypes_dict(), c.dims_dict(), fixed=f)
        _LEGAL[key] = out
    return [dict(p) for p in _LEGAL[key]]


def legal_before_prep_options(c: Cell) -> list[dict]:
    """The legal points at prep_round cvt and prep_vec off (those options off): the space the legality tests of the
    earlier options count (the tests of prep_round and prep_vec cover those)."""
    return [p for p in all_legal(c) if p["prep_round"] == "cvt" and not p["prep_vec"]]


# ---- the render pins: each option off renders the code from before the option -------------------------------

# The sha256 of the render of every point each pin holds, on PREFILL_CELLS[0] (the specialized dims are K and V
# only), in one table; when a pin's code is changed on purpose, rewrite it: KF_UPDATE_GOLDEN=1 python -m pytest
# tests/unit/test_kda_chunk.py -k golden. A new option adds a pin here (the points where it is off) and its rows
# there, not a test that renders the space.
RENDER_GOLDEN = Path(__file__).resolve().parent / "data" / "kda_chunk_renders.json.gz"
LATER_THAN_LDSM = {"recur_fuse": False, "prep_round": "cvt", "prep_vec": False, "kwarps": 1, "prep_wu": "tf32",
                   "recur_early": "none", "prep_v": "early"}


def render_pins(c: Cell) -> dict[str, list[dict]]:
    """Each pin's points, in the order the pin was first digested: at the option's off value, the points it had
    before the option existed (the legal ones where the option's legality is not the later options')."""
    dt, dims = c.dtypes_dict(), c.dims_dict()

    def legal_with(pts: list[dict], over: dict) -> list[dict]:
        return [p | over for p in pts if TDEF.is_valid(p | over, ARCH, dt, dims)]

    ks = all_legal(c, ksplit=True)
    pins = {"options": [dict(zip(OLD_SPACE, v)) | OPTIONS for v in product(*OLD_SPACE.values())]}
    # recur_ldsm and recur_fuse off, with the options added after them off (recur_addr swz: carry is a kernel of its own)
    pins["recur_ldsm"] = TDEF.legal_points(ARCH, dt, dims, fixed={"recur_ldsm": False} | LATER_THAN_LDSM)
    pins["recur_fuse"] = TDEF.legal_points(ARCH, dt, dims, fixed={"recur_ldsm": True, "recur_addr": "swz"}
                                           | LATER_THAN_LDSM)
    # the K-split carry recurrence at recur_early none
    pins["recur_early"] = [p | {"recur_addr": "carry", "recur_early": "none"} for p in ks if p["kwarps"] > 1]
    # v staged early: the staged rowcol points at chunk 32, tf32 and bf16 w, u
    pts = [p for p in ks if p["chunk"] == 32 and p["stage_in"] and p["prep_addr"] == "rowcol"]
    pins["prep_v"] = legal_with(pts + [p | {"prep_wu": "bf16"} for p in pts], {"prep_v": "early"})
    return pins


def point_code(p: dict) -> str:
    """A point as the index of each param's value, in the space's order (each param has at most 10 values)."""
    return "".join(str(TDEF.values(k).index(p[k])) for k in TDEF.param_names)


def render_digest(c: Cell, p: dict) -> str:
    return hashlib.sha256(source(TDEF, c, p).encode()).hexdigest()[:16]


def test_option_pins_render_the_golden_table():
    """Every pin holds the points it held when its option was added (the same points, in the same order), and each
    renders byte for byte the code the table recorded (a 64-bit prefix of its sha256)."""
    c = PREFILL_CELLS[0]
    got = {name: {point_code(p): render_digest(c, p) for p in pts} for name, pts in render_pins(c).items()}
    if os.environ.get("KF_UPDATE_GOLDEN"):
        RENDER_GOLDEN.write_bytes(gzip.compress(json.dumps(
            {"cell": c.label(), "params": list(TDEF.param_names), "pins": got}, indent=0).encode(), mtime=0))
    golden = json.loads(gzip.decompress(RENDER_GOLDEN.read_bytes()))
    assert golden["cell"] == c.label() and golden["params"] == list(TDEF.param_names)
    assert list(got) == list(golden["pins"])
    for name, want in golden["pins"].items():
        assert list(got[name]) == list(want), f"pin {name}: its points changed ({len(got[name])} now, {len(want)} then)"
        changed = [k for k in want if got[name][k] != want[k]]
        assert not changed, (f"pin {name}: {len(changed)} of {len(want)} points render other code than before, e.g. "
                             + str(dict(zip(TDEF.param_names, (TDEF.values(k)[int(i)] for k, i in zip(TDEF.param_names, changed[0]))))))


def test_the_space_grew_by_the_options_only():
    """The old space's params and values are the template's but for the options (their renders off:
    test_option_pins_render_the_golden_table), and the legal space's size is each option's count."""
    assert set(TDEF.param_names) == set(OLD_SPACE) | set(OPTIONS)
    assert all(list(TDEF.values(k)) == v for k, v in OLD_SPACE.items())
    c = PREFILL_CELLS[0]
    legal = all_legal(c)
    # the whole space: the 688 points of test_recur_lean_legality (408 + 280 lean), recur_ldsm doubles them, recur_fuse
    # adds the 280 lean ones, prep_round doubles that, and prep_vec repeats every stage_in point (half of them)
    before_vec = 2 * (2 * 688 + 280)
    # prep_diag = mma repeats the points of the vectorized, one-add prep (test_mma_diag_legality)
    # prep_exp = ex2 and prep_addr = rowcol are offered on the mma prep only: its points at the other two exponentials
    # and swz (`first`), then each again at ex2, and all three at rowcol (test_ex2_rowcol_legality): 2 more a point
    first = [p for p in legal if p["prep_exp"] != "ex2" and p["prep_addr"] == "swz"]
    mma = [p for p in first if p["prep_diag"] == "mma"]
    vec_add = [p for p in first if p["prep_diag"] == "warp_row" and p["prep_vec"] and p["prep_round"] == "add"]
    staged = [p for p in first if p["stage_in"] and not p["prep_vec"]]
    assert before_vec == 3312 and len(staged) == before_vec // 2 and len(mma) == len(vec_add) == 828
    assert len(first) == before_vec + len(staged) + len(mma) == 5796
    assert len(legal) == len(first) + (3 * 2 - 2) * len(mma) // 2 == 7452
    # kwarps 2, 4: launch 2 of its own, the one-warp-a-column options off (test_kwarps_legality)
    ksplit = [p for p in all_legal(c, ksplit=True) if p["kwarps"] > 1]
    assert len(all_legal(c, ksplit=True)) == len(legal) + len(ksplit) and len(ksplit) == KSPLIT_POINTS
    assert len([p for p in legal if all(p[k] == off for k, off in OPTIONS.items())]) == 54


def prep_key(p: dict) -> tuple:  # what kda_chunk_prep's code depends on
    return p["chunk"], p["prep_threads"], p["stage_in"], p["prep_exp"]


def recur_key(p: dict) -> tuple:  # what kda_chunk_recur's code depends on
    return (p["chunk"], p["warps"], p["stages"], p["state_split"], p["u_prefetch"], p["recur_lean"], p["recur_ldsm"],
            p["recur_fuse"], p["kwarps"])


def test_option_points_compile_without_spills():
    """Every legal point with an option on builds for sm_90a without spills: a point is its two kernels,
    each rendered from its own params (prep_key, recur_key): of the 12 prep kernels with stage_in or the fast exp
    and the 24 recurrences with u_prefetch, points holding each chunk, prep_threads and option pair of those prep
    kernels and each warps, stages and state_split of those recurrences at least once are built (covering)."""
    c = PREFILL_CELLS[2]
    legal = [p for p in all_legal(c) if any(p[k] != off for k, off in OPTIONS.items()) and p["prep_diag"] == "warp_row"
             and not p["recur_lean"] and not p["recur_ldsm"]]  # test_recur_lean_ / test_recur_ldsm_points_compile_without_spills
    for p in legal:
        g = Genome.make("kda", "chunk", TDEF.source_hash, p)
        src = prepare(TDEF, g, "sm_90a", c.dtypes_dict(), c.dims_dict()).source
        kernels = src.split("kda_chunk_recur(", 1)
        assert ("cp.async.wait_all" in kernels[0]) == p["stage_in"] and ("load_u(" in kernels[1]) == p["u_prefetch"]
        assert ("__expf(" in kernels[0]) == (p["prep_exp"] == "fast") and "expf(" not in kernels[1]
    todo = {("prep", prep_key(p)) for p in legal if p["stage_in"] or p["prep_exp"] == "fast"}
    todo |= {("recur", recur_key(p)) for p in legal if p["u_prefetch"]}
    assert len(todo) == 4 * 3 + 24  # (chunk, prep_threads) x 3 option pairs; (warps, stages, state_split) at chunk 32

    def prep_opt(f):
        return lambda p: f(p) if p["stage_in"] or p["prep_exp"] == "fast" else None

    def recur_opt(k: str):
        return lambda p: p[k] if p["u_prefetch"] else None

    points = covering(legal, prep_opt(lambda p: p["chunk"]), prep_opt(lambda p: p["prep_threads"]),
                      prep_opt(lambda p: (p["stage_in"], p["prep_exp"])), *map(recur_opt, ("warps", "stages", "state_split")))
    assert len(points) <= 5, points
    compile_clean(c, points)


def prep_ctas_per_sm(p: dict, regs: int) -> int:
    """Resident prep CTAs an SM of the H200 holds: 64 K registers (a warp's allocated 8 at a time per thread),
    228 KB of shared memory less 1 KB a CTA, 2048 threads."""
    by_regs = 65536 // (-(-regs // 8) * 8 * p["prep_threads"])
    by_smem = 233472 // (prep_smem(p, 128, 128) + 1024)
    return min(by_regs, by_smem, 2048 // p["prep_threads"])


def test_u_prefetch_at_chunk_64_spills_as_its_constraint_says():
    """The reason for u_prefetch_fits_registers_at_chunk_32: 32 more live registers a thread at chunk 64."""
    c = PREFILL_CELLS[2]
    p = TDEF.default_params() | {"chunk": 64, "u_prefetch": True}
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == ["u_prefetch_fits_registers_at_chunk_32"]
    r = compile_point(c, p)  # compile_one does not check constraints
    assert r.status.ok, r.error
    # at the edge: it spilled until the varlen change moved helpers out of line, and now sits at the 255-register
    # ceiling under NVRTC 13.5 (the H200 machine's NVRTC 13.0 allocates differently): the constraint stays
    # until it has room to spare
    rec = dict(r.resources)["kda_chunk_recur"]
    assert rec.spill_stores > 0 or rec.regs >= 255, rec


# ---- recur_lean: exp(G_last) through the ring, compile-time refills after the mma work, packed o stores ------

def recur_src(p: dict, c: Cell = PREFILL_CELLS[0]) -> str:
    return source(TDEF, c, p).split("kda_chunk_recur(", 1)[1]


def step_loop(recur: str) -> str:
    """The chunk loop's body (from `for (int c = 0; c < NT; ++c)` to the final wait_group 0)."""
    a = recur.index("for (int c = 0; c < NT; ++c) {")
    return recur[a:recur.index('cp.async.wait_group 0;', a)]


def test_recur_lean_legality():
    """Legal wherever it builds spill-free: refused only with u_prefetch at state_split or stages 4 (where 7 of
    the 24 builds spill and the rest sit at 255 registers); 280 more points, the space 408 + 280 = 688, 35
    lean recurrence kernels; the prefill experiment's 48 points all have a lean twin."""
    c = PREFILL_CELLS[0]
    legal = [p for p in legal_before_prep_options(c) if not p["recur_ldsm"]]  # (recur_ldsm doubles it: test_recur_ldsm_legality)
    off = [p for p in legal if not p["recur_lean"]]
    on = [p for p in legal if p["recur_lean"]]
    assert len(legal) == 688 and len(off) == 408 and len(on) == 280
    assert len({recur_key(p) for p in on}) == 35
    bad = [p for p in off if p["u_prefetch"] and (p["state_split"] or p["stages"] == 4)]
    assert sorted(map(str, on)) == sorted(str(p | {"recur_lean": True}) for p in off if p not in bad)
    for p in bad[:20]:
        assert TDEF.violations(p | {"recur_lean": True}, ARCH, c.dtypes_dict(), c.dims_dict()) == ["lean_fits_registers"]
    exp_space = {"chunk": [32], "stage_in": [True], "u_prefetch": [True, False], "state_split": [False], "stages": [3, 6],
                 "warps": [1, 2, 8], "prep_threads": [128, 256], "prep_exp": ["expf", "fast"],
                 "prep_diag": ["warp_row"], "recur_lean": [False, True], "recur_ldsm": [False], "recur_fuse": [False],
                 "prep_round": ["cvt"], "prep_vec": [False], "kwarps": [1], "overlap": [False], "prep_addr": ["swz"],
                 "recur_addr": ["swz"], "prep_wu": ["tf32"], "recur_early": ["none"], "prep_v": ["early"]}
    pts = [dict(zip(exp_space, v)) for v in product(*exp_space.values())]
    assert sum(TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()) for p in pts) == 96


@pytest.mark.parametrize("chunk", [32, 64])
def test_recur_lean_loads_no_gl_from_global_in_the_step(chunk: int):
    """The rendered step loop: with recur_lean no ws_gl read but the cp.async into the A_qk slot's tail (issued
    by issue_k2, outside the step's items), the decay read from shared memory in item 2, every refill with a
    literal kind after its item's mma (none inside acquire), o stored as 32-bit pairs; off, the old code."""
    p = TDEF.default_params() | {"chunk": chunk, "warps": 2, "stages": 3}
    on, off = recur_src(p | {"recur_lean": True}), recur_src(p)
    assert "ws_gl + ch * K + 8 * n" in step_loop(off) and "issue(it + NS - 1);" in off
    loop = step_loop(on)
    assert "ws_gl" not in loop and "__ldg" not in loop
    assert "const float* gls = reinterpret_cast<const float*>(sa + C * C * 2);" in loop
    assert loop.index("mma_bf16(acc_o[n], va[kb], b0, b1);") < loop.index("gls + 8 * n + 2 * tig") < loop.index(
        "const unsigned char* sk = acquire(4 * c + 3);")
    assert "issue(" not in on and on.count("ws_gl") == 2  # the parameter and issue_k2's cp.async source
    assert "(ws_gl + ch * K + 4 * tid)" in on and "dst + C * C * 2 + 16 * tid" in on
    refills = re.findall(r"issue_k(\d)\(4 \* c \+ (\d) \+ NS - 1\);", loop)
    assert refills == [(str((k + 3 - 1) % 4), str(k)) for k in range(4)]
    assert re.findall(r"issue_k(\d)\((\d+)\);", on) == [("0", "0"), ("1", "1")]  # the prologue, NS - 1 items
    assert re.findall(r"auto (issue_k\d) = \[&\]\(int it\)", on) == [f"issue_k{k}" for k in range(4)]  # no generic lambda
    assert "](auto" not in on  # NVRTC 13.0 refuses a generic lambda in a kernel (docs/nvrtc_13_0.md)
    for k in range(4):  # each refill after its item's mma and before the next item's acquire
        item = loop.split(f"acquire(4 * c{f' + {k}' if k else ''})", 1)[1].split(f"acquire(4 * c + {k + 1})", 1)[0]
        assert item.rindex("mma_bf16(") < item.index(f"issue_k{(k + 3 - 1) % 4}(")
    assert "op[4] = odd ? pack_bf16(r1, acc_o[n][3]) : pack_bf16(acc_o[n][2], r1);" in loop
    assert "__float2bfloat16_rn(acc_o" not in loop


def test_recur_lean_gl_fits_the_a_qk_slot():
    """exp(G_last) (K fp32) sits after A_qk (C C bf16) in a ring slot of C K bf16, so the launch's smem is unchanged
    (the plan checked once per combination of the params it reads: one_per_case)."""
    for c in PREFILL_CELLS:
        K = c.dim("K")
        lean = [p for p in all_legal(c) if p["recur_lean"]]
        for p in lean:
            C = p["chunk"]
            assert C * C * 2 + K * 4 <= C * K * 2 and K // 4 <= 32 * p["warps"], p
        for p in one_per_case(lean):
            launches, _ = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
            assert launches[1].smem == p["stages"] * p["chunk"] * K * 2 == launches[1].smem <= 48 * 1024, p


def packed_o_store(acc: np.ndarray, T: int, t0: int) -> np.ndarray:
    """recur_lean's o stores mirrored: acc[lane][n][e] of one warp's tile; returns out[t][col] (16 columns), each
    element written once, from the same fp32 values (the bf16 rounding per element unchanged)."""
    out = np.full((T, 16), np.nan)
    count = np.zeros((T, 16), int)
    for lane in range(32):
        grp, tig = lane >> 2, lane & 3
        odd = grp & 1
        part = lane ^ 4
        for n in range(acc.shape[1]):
            r0 = acc[part][n][1] if not (part >> 2) & 1 else acc[part][n][0]
            r1 = acc[part][n][3] if not (part >> 2) & 1 else acc[part][n][2]
            t = t0 + 8 * n + 2 * tig + odd
            if t < T:
                col = grp - odd
                lo, hi = (r0, acc[lane][n][1]) if odd else (acc[lane][n][0], r0)
                lo2, hi2 = (r1, acc[lane][n][3]) if odd else (acc[lane][n][2], r1)
                for cc, v in ((col, lo), (col + 1, hi), (col + 8, lo2), (col + 9, hi2)):
                    out[t, cc] = v
                    count[t, cc] += 1
    return out, count


@pytest.mark.parametrize("T", [32, 29, 1])
def test_recur_lean_packed_o_store_is_the_scalar_store(T: int):
    """The packed store writes every (t, column) of the warp's tile the scalar store wrote, once, with its value:
    lane (grp, tig) holds [0] (t, vr), [1] (t + 1, vr), [2] (t, vr + 8), [3] (t + 1, vr + 8), t = 8 n + 2 tig."""
    rng = np.random.default_rng(T)
    acc = rng.standard_normal((32, 4, 4))
    want = np.full((T, 16), np.nan)
    for lane in range(32):
        grp, tig = lane >> 2, lane & 3
        for n in range(4):
            t = 8 * n + 2 * tig
            for e, (dt, dc) in enumerate(((0, 0), (1, 0), (0, 8), (1, 8))):
                if t + dt < T:
                    want[t + dt, grp + dc] = acc[lane][n][e]
    got, count = packed_o_store(acc, T, 0)
    assert (count == 1).all() and np.array_equal(got, want)


def lean_kernels(c: Cell) -> list[dict]:
    """One legal point per lean recurrence to build: chunk 32 x warps 1, 2, 8 x stages 3, 6 x u_prefetch (state_split
    off), and chunk 64 at warps 2."""
    out = []
    for p in all_legal(c):
        if p["recur_lean"] and not p["recur_ldsm"] and p["prep_diag"] == "warp_row" and not p["state_split"] and (
                (p["chunk"] == 32 and p["warps"] in (1, 2, 8) and p["stages"] in (3, 6)) or (p["chunk"] == 64 and p["warps"] == 2)):
            if recur_key(p) not in {recur_key(q) for q in out}:
                out.append(p)
    return out


def test_recur_lean_points_compile_without_spills():
    """Of the 13 lean recurrences, those holding every chunk, warps, stages and u_prefetch among them (with their
    prep kernels) build for sm_90a without spills, stack or static smem, at most 255 registers, in the declared smem
    (the ring's; gl in the A_qk slot)."""
    c = PREFILL_CELLS[2]
    points = lean_kernels(c)
    assert len(points) == 13
    points = covering(points, "chunk", "warps", "stages", "u_prefetch")
    regs = {}
    for p, res in zip(points, compile_clean(c, points)):
        assert all(r.regs <= 255 for r in res.values()), (p, res)
        regs[recur_key(p)[:5]] = res["kda_chunk_recur"].regs
        launches, _ = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
        assert launches[1].smem == p["stages"] * p["chunk"] * c.dim("K") * 2 <= 48 * 1024
    print("lean recur registers (chunk, warps, stages, state_split, u_prefetch):", regs)


def test_recur_lean_with_u_prefetch_at_stages_4_spills_as_its_constraint_says():
    """The reason for lean_fits_registers: chunk 32, warps 2, stages 4 with u_prefetch spills."""
    c = PREFILL_CELLS[2]
    p = TDEF.default_params() | {"chunk": 32, "stages": 4, "u_prefetch": True, "recur_lean": True}
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == ["lean_fits_registers"]
    r = compile_point(c, p)
    assert r.status.ok, r.error
    rec = dict(r.resources)["kda_chunk_recur"]  # spilling, or at the 255-register ceiling (see above)
    assert rec.spill_stores > 0 or rec.regs >= 255, rec


# ---- recur_ldsm: the recurrence's B fragments by ldmatrix.x4 from hoisted per-lane offsets ------------------
#
# PTX ISA (ldmatrix, checked against its text): with .x4, threads 8 i .. 8 i + 7 give the start addresses of
# matrix i's 8 rows (16-byte aligned, 8 b16 each); "each thread in a warp loads fragments of a row, with thread 0
# receiving the first fragment in its register r", a group of 4 threads a row: thread t receives, in destination
# register i, row t / 4 of matrix i, elements 2 (t % 4) and 2 (t % 4) + 1 (low half the lower). No .trans is
# needed: every ring tile is stored n-major (the B operand's n is its row, 8 consecutive k a 16-byte piece), so
# a matrix's row grp, word tig is the m16n8k16 B word (k 2 tig.., n grp) that the scalar path loads.

# the rendered lines the model below mirrors (lane offsets, address, the four items' load groups and mmas)
LDSM_LINES = [
    "const int li = lane >> 3, lr = lane & 7;",
    "const int sd = swz<RB>(d);",
    "return slot + (lane_sw ^ (unsigned)(sd & 0x70)) + (unsigned)(sd & ~0x70);",
    '"ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3}, [%4];"',
    ': "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])',
    "for (int kp = 0; kp < K / 32; ++kp) {",
    "for (int n = 0; n < C / 8; ++n) ldsm_x4(ldsm_addr<K * 2>(sw_s, lk, (8 * n * K + 32 * kp) * 2), b[n]);",
    "for (int n = 0; n < C / 8; ++n) ldsm_x4(ldsm_addr<K * 2>(sq_s, lk, (8 * n * K + 32 * kp) * 2), b[n]);",
    "const int kb = 2 * kp + h;",
    "mma_bf16(acc_v[n], hi, b[n][2 * h], b[n][2 * h + 1]);",
    "mma_bf16(acc_o[n], hi, b[n][2 * h], b[n][2 * h + 1]);",
    "for (int n = 0; n < C / 8; n += 2) {",
    "if (16 * kb <= 8 * n + 7) {",
    "ldsm_x4(ldsm_addr<C * 2>(sa_s, lc, (8 * n * C + 16 * kb) * 2), b);",
    "mma_bf16(acc_o[n], va[kb], b[0], b[1]);",
    "mma_bf16(acc_o[n + 1], va[kb], b[2], b[3]);",
    "for (int n = 0; n < K / 8; n += 2) {",
    "ldsm_x4(ldsm_addr<C * 2>(sk_s, lc, (8 * n * C + 16 * kb) * 2), b);",
    "mma_bf16(S[n], va[kb], b[0], b[1]);",
    "mma_bf16(S[n + 1], va[kb], b[2], b[3]);",
]


def ldsm_point(C: int, warps: int = 2, **kw) -> dict:
    return TDEF.default_params() | {"chunk": C, "warps": warps, "stages": 3, "recur_lean": True, "recur_ldsm": True} | kw


def swz_model(src: str):
    """The template's swz<ROW_BYTES>(off), read from the rendered CUDA (its L and its return expression)."""
    m = re.search(r"int swz\(int off\) \{\n\s*constexpr int L = ROW_BYTES >= (\d+) \? ROW_BYTES : (\d+);\n"
                  r"\s*return ([^;]+);", src)
    assert m, "no swz() in the rendering"
    lo, hi, expr = int(m.group(1)), int(m.group(2)), m.group(3).replace("/", "//")
    assert set(expr) <= set("offL^()/&<> 0123456789") and lo == hi
    return lambda rb, off: eval(expr, {}, {"off": off, "L": rb if rb >= lo else hi})  # noqa: S307 (checked characters)


def lane_offsets(recur: str, swz, C: int, K: int):
    """lk and lc (the lanes' swizzled offsets in the 2 K-byte and 2 C-byte row tiles), read from the rendering."""
    out = {}
    for name in ("lk", "lc"):
        m = re.search(rf"const unsigned {name} = \(unsigned\)swz<([CK]) \* 2>\(([^;]+)\);", recur)
        assert m, name
        rb, expr = {"K": 2 * K, "C": 2 * C}[m.group(1)], m.group(2)
        assert set(expr) <= set("lirCK*+()&>0123456789 ")
        out[name] = (rb, [swz(rb, eval(expr, {}, {"li": ln >> 3, "lr": ln & 7, "C": C, "K": K}))  # noqa: S307
                          for ln in range(32)])
    return out


def group_offsets(recur: str) -> dict[str, str]:
    """Each item's ldmatrix group offset d (an expression of n, kp or kb), read from the rendering."""
    out = {}
    for slot, lane, expr in re.findall(r"ldsm_addr<[CK] \* 2>\((\w+)_s, (l[kc]), (.+?)\), b(?:\[n\])?\);", recur):
        assert set(expr) <= set("nkpbCK*+() 0123456789"), expr
        out[slot] = (lane, expr)
    return out


def ldsm_addr(slot: int, lane_sw: int, d: int, swz, rb: int) -> int:
    sd = swz(rb, d)
    return slot + (lane_sw ^ (sd & 0x70)) + (sd & ~0x70)


def ring_tile(rows: int, cols: int, swz):
    """A ring slot holding a [rows][cols] bf16 tile of distinct element ids, written as issue() does (each 16-byte
    piece of the row-major tile at its swizzled offset); the tile and a reader of 32-bit words."""
    tile = np.arange(rows * cols, dtype=np.uint16).reshape(rows, cols)
    flat, smem = tile.tobytes(), bytearray(rows * cols * 2)
    for i in range(0, len(flat), 16):
        o = swz(2 * cols, i)
        smem[o:o + 16] = flat[i:i + 16]
    assert bytes(sorted(smem)) == bytes(sorted(flat))
    return tile, lambda a: int.from_bytes(smem[a:a + 4], "little")


def ldsm_x4(addr: list[int], word) -> list[list[int]]:
    """ldmatrix.m8n8.x4.b16 as the PTX ISA gives it: r[t][i] = matrix i's (rows at addr[8 i ..]) row t / 4, word t % 4."""
    assert all(a % 16 == 0 for a in addr)
    return [[word(addr[8 * i + t // 4] + 4 * (t % 4)) for i in range(4)] for t in range(32)]


def scalar_mmas(kind: int, C: int, K: int, word, swz) -> dict:
    """The scalar path's mma sequence per accumulator: acc -> [(A operand, b0 of each lane, b1 of each lane)]."""
    rows, cols = ((C, K), (C, K), (C, C), (K, C))[kind]

    def w(row, col):  # word_k / word_c
        return word(swz(2 * cols, (row * cols + col) * 2))

    seq: dict = {}
    ksteps, ntiles = (K // 16, C // 8) if kind < 2 else (C // 16, C // 8 if kind == 2 else K // 8)
    for kb in range(ksteps):
        for n in range(ntiles):
            if kind == 2 and not 16 * kb <= 8 * n + 7:
                continue
            b0 = tuple(w(8 * n + (ln >> 2), 16 * kb + 2 * (ln & 3)) for ln in range(32))
            b1 = tuple(w(8 * n + (ln >> 2), 16 * kb + 8 + 2 * (ln & 3)) for ln in range(32))
            seq.setdefault(n, []).append((kb, b0, b1))
    return seq


def ldsm_mmas(kind: int, C: int, K: int, word, swz, lanes: dict, groups: dict, tids: range) -> dict:
    """recur_ldsm's mma sequence per accumulator, from the rendered lane offsets and group offsets, every lane's
    address as ldsm_addr makes it (slot 0) for the threads `tids` (lane = tid & 31), words as ldmatrix gives them."""
    lane_name, expr = groups[("sw", "sq", "sa", "sk")[kind]]
    rb, lane_sw = lanes[lane_name]

    def load(**v):
        d = eval(expr, {}, v | {"C": C, "K": K})  # noqa: S307 (checked characters)
        addr = [ldsm_addr(0, lane_sw[t & 31], d, swz, rb) for t in tids][:32]
        return ldsm_x4(addr, word)

    def regs(r, i):
        return tuple(r[t][i] for t in range(32))

    seq: dict = {}
    if kind < 2:
        for kp in range(K // 32):
            b = [load(n=n, kp=kp) for n in range(C // 8)]
            for h in range(2):
                for n in range(C // 8):
                    seq.setdefault(n, []).append((2 * kp + h, regs(b[n], 2 * h), regs(b[n], 2 * h + 1)))
    else:
        for kb in range(C // 16):
            for n in range(0, C // 8 if kind == 2 else K // 8, 2):
                if kind == 3 or 16 * kb <= 8 * n + 7:
                    b = load(n=n, kb=kb)
                    seq.setdefault(n, []).append((kb, regs(b, 0), regs(b, 1)))
                    seq.setdefault(n + 1, []).append((kb, regs(b, 2), regs(b, 3)))
    return seq


@pytest.mark.parametrize("C", [32, 64])
@pytest.mark.parametrize("warps", [1, 2, 8])
def test_recur_ldsm_gives_every_lane_the_scalar_paths_words(C: int, warps: int):
    """For each of the 4 ring kinds (-w, qg [C][K]; A_qk [C][C]; kgT [K][C]), every lane of every warp gets, for every
    mma, the same 32-bit B words as the scalar LDS path (word_k / word_c), holding the elements the m16n8k16 B
    fragment asks for, and each accumulator sees the same mma sequence (A operand, b0, b1) in the same order: the
    results are bit-identical. The model takes swz, the lane offsets and the group offsets from the rendering."""
    K = 128
    p = ldsm_point(C, warps)
    src = source(TDEF, PREFILL_CELLS[0], p)
    recur = src.split("kda_chunk_recur(", 1)[1]
    for line in LDSM_LINES:
        assert line in src, line
    assert "word_k(" not in recur and "word_c(" not in recur
    swz = swz_model(src)
    lanes, groups = lane_offsets(recur, swz, C, K), group_offsets(recur)
    assert groups == {"sw": ("lk", "(8 * n * K + 32 * kp) * 2"), "sq": ("lk", "(8 * n * K + 32 * kp) * 2"),
                      "sa": ("lc", "(8 * n * C + 16 * kb) * 2"), "sk": ("lc", "(8 * n * C + 16 * kb) * 2")}
    for kind in range(4):
        rows, cols = ((C, K), (C, K), (C, C), (K, C))[kind]
        tile, word = ring_tile(rows, cols, swz)
        want = scalar_mmas(kind, C, K, word, swz)
        for tid in range(0, 32 * warps, 32):  # each warp: the same lanes, the same words
            got = ldsm_mmas(kind, C, K, word, swz, lanes, groups, range(tid, tid + 32))
            assert got == want, (kind, tid)
        for n, calls in want.items():  # and those words are the B fragment: (k 2 tig.., n grp), (k 2 tig + 8.., n grp)
            for kb, b0, b1 in calls:
                for ln in range(32):
                    g, t = ln >> 2, ln & 3
                    e = tile[8 * n + g, 16 * kb + 2 * t:16 * kb + 2 * t + 2].astype(np.uint32)
                    f = tile[8 * n + g, 16 * kb + 8 + 2 * t:16 * kb + 8 + 2 * t + 2].astype(np.uint32)
                    assert (b0[ln], b1[ln]) == (int(e[0] | e[1] << 16), int(f[0] | f[1] << 16))
        assert sum(len(v) for v in want.values()) == {0: C * K // 128, 1: C * K // 128, 2: (C // 16) * (C // 16 + 1),
                                                      3: C * K // 128}[kind]


@pytest.mark.parametrize("C", [32, 64])
def test_recur_ldsm_offsets_hoist_and_read_conflict_free(C: int):
    """The address split ldsm_addr relies on: a lane's offset and a group's offset have disjoint bits (so swz of the
    sum is the XOR of the swz's), swz(d)'s bits 4..6 take 2 values a tile kind at chunk 32 (4 for the C-row tiles at
    chunk 64), the rest is a multiple of 16 (an immediate); each matrix's 8 rows hit 8 distinct 16-byte bank groups
    (one wavefront a matrix, as the scalar loads were conflict-free); 51 ldmatrix.x4 a step at chunk 32 (204 LDS.32)."""
    K = 128
    src = source(TDEF, PREFILL_CELLS[0], ldsm_point(C))
    recur = src.split("kda_chunk_recur(", 1)[1]
    swz = swz_model(src)
    lanes = {}
    for name, rb, raw in (("lk", 2 * K, lambda li, lr: lr * K * 2 + 16 * li),
                          ("lc", 2 * C, lambda li, lr: (8 * (li >> 1) + lr) * C * 2 + 16 * (li & 1))):
        lanes[name] = (rb, [raw(ln >> 3, ln & 7) for ln in range(32)])
    assert {k: (rb, [swz(rb, o) for o in v]) for k, (rb, v) in lanes.items()} == lane_offsets(recur, swz, C, K)
    ds = {"lk": [(8 * n * K + 32 * kp) * 2 for n in range(C // 8) for kp in range(K // 32)],
          "lc": [(8 * n * C + 16 * kb) * 2 for n in range(0, K // 8, 2) for kb in range(C // 16)]}
    variants = {}
    for name, (rb, raw) in lanes.items():
        variants[name] = {swz(rb, d) & 0x70 for d in ds[name]}
        for d in ds[name]:
            assert all(r & d == 0 for r in raw), (name, d)
            assert all(swz(rb, r + d) == swz(rb, r) ^ swz(rb, d) == ldsm_addr(0, swz(rb, r), d, swz, rb) for r in raw)
            for i in range(4):
                rows = [ldsm_addr(0, swz(rb, r), d, swz, rb) for r in raw[8 * i:8 * i + 8]]
                assert len({a // 16 % 8 for a in rows}) == 8
    assert {k: len(v) for k, v in variants.items()} == {"lk": 2, "lc": 2 if C == 32 else 4}
    loads = K // 32 * C // 8 * 2 + sum(1 for kb in range(C // 16) for n in range(0, C // 8, 2) if 16 * kb <= 8 * n + 7) \
        + C // 16 * K // 16
    assert loads == {32: 51, 64: 106}[C]


# sha256 of the 1376 renders of the space before recur_ldsm (every legal point, recur_ldsm off, in product order of
# the other keys, on PREFILL_CELLS[0]), taken from the template before the option existed: off, it renders that code
def test_recur_ldsm_legality():
    """recur_ldsm is legal wherever its point is without it (no constraint of its own: all 86 of its recurrences
    build spill-free, see the template's comment at lean_fits_registers), with recur_lean on or off: the space
    doubles to 1376 points (1656 with recur_fuse). The prefill experiment's toml does not name it, so its restricted
    space keeps both values."""
    c = PREFILL_CELLS[0]
    legal = [p for p in legal_before_prep_options(c) if not p["recur_fuse"]]  # (recur_fuse: test_recur_fuse_legality)
    off = [p for p in legal if not p["recur_ldsm"]]
    on = [p for p in legal if p["recur_ldsm"]]
    assert len(off) == len(on) == 688
    assert sorted(map(str, on)) == sorted(str(p | {"recur_ldsm": True}) for p in off)
    assert len({recur_key(p) for p in on}) == 86 and len({recur_key(p) for p in on if p["recur_lean"]}) == 35
    assert TDEF.default_params()["recur_ldsm"] is False


def ldsm_kernels(c: Cell) -> list[dict]:
    """One legal point per recurrence to build with recur_ldsm: chunk 32 x warps 1, 2, 8 x stages 3, 6 x u_prefetch
    with recur_lean, the key point without it, state_split at warps 8, chunk 64 at warps 2 with and without
    recur_lean (16 kernels; the template's space has 86, all built spill-free when the option was added)."""
    want = [(32, w, s, False, u, True) for w in (1, 2, 8) for s in (3, 6) for u in (False, True)]
    want += [(32, 2, 6, False, True, False), (32, 8, 3, True, False, True), (64, 2, 3, False, False, True),
             (64, 2, 3, False, False, False)]
    out = {}
    for p in all_legal(c):
        if p["recur_ldsm"] and not p["recur_fuse"] and p["prep_diag"] == "warp_row" and recur_key(p)[:6] in want:
            out.setdefault(recur_key(p), p)
    assert len(out) == len(want)
    return list(out.values())


def test_recur_ldsm_points_compile_without_spills():
    """Of the 16 recurrences with recur_ldsm, those holding every chunk, warps, stages, state_split, u_prefetch and
    recur_lean among them (and their prep kernels) build for sm_90a without spills, stack or static smem, at most
    255 registers, in the declared smem."""
    c = PREFILL_CELLS[2]
    points = covering(ldsm_kernels(c), "chunk", "warps", "stages", "state_split", "u_prefetch", "recur_lean")
    regs = {}
    for p, res in zip(points, compile_clean(c, points)):
        assert all(r.regs <= 255 for r in res.values()), (p, res)
        regs[recur_key(p)[:6]] = res["kda_chunk_recur"].regs
        launches, _ = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
        assert launches[1].smem == p["stages"] * p["chunk"] * c.dim("K") * 2 <= 48 * 1024
    print("ldsm recur registers (chunk, warps, stages, state_split, u_prefetch, recur_lean):", regs)


# ---- recur_fuse: items 0 and 1 as one (one bf16 S^T fragment a k-step for w S and q' S) ----------------------

def ring_events(recur: str) -> tuple[list, list]:
    """The recurrence's ring protocol as rendered: the prologue's issues [(kind, item)] and the chunk loop's events
    in program order: ("wait", d: NS - d groups left in flight) + barrier, ("read", item offset), ("issue", kind, item offset)."""
    waits = dict(re.findall(r"auto (acquire\w*) = \[&\]\(int it\) -> const unsigned char\* \{\n\s*asm volatile\("
                            r"\"cp\.async\.wait_group %0;\" :: \"n\"\(NS - (\d)\)", recur))
    prologue = [(int(k), int(i)) for k, i in re.findall(r"issue_k(\d)\((\d+)\);", recur)]
    loop, events = step_loop(recur), []
    for m in re.finditer(r"(acquire\w*)\(4 \* c(?: \+ (\d))?\)|slot_s\(4 \* c(?: \+ (\d))?\)|"
                         r"issue_k(\d)\(4 \* c \+ (\d) \+ NS - 1\)|gls \+ 8 \* n", loop):
        if m.group(1):
            events += [("wait", int(waits[m.group(1)])), ("read", int(m.group(2) or 0))]
        elif m.group(0).startswith("slot_s"):
            events.append(("read", int(m.group(3) or 0)))
        elif m.group(4):
            events.append(("issue", int(m.group(4)), int(m.group(5)) - 1))  # + NS - 1 added below
        else:
            events.append(("read", 2))  # exp(G_last) from the A_qk slot's tail
    return prologue, events


def run_ring(prologue: list, events: list, NS: int, NT: int) -> list[int]:
    """The cp.async ring simulated at its latest: a commit group lands only when a wait_group makes it. Every read
    must find its item landed in its slot (`it % NS`), and within one barrier interval no slot may be both read and
    refilled (the warps run anywhere in the interval); each refill's compile-time kind must be its item's. Returns
    the items read, in order."""
    groups: list = []  # item of each commit group (None: an empty group past the last item)
    landed: dict[int, int] = {}  # slot -> item landed there
    pending: dict[int, int] = {}  # slot -> item in flight to it
    seen: list[int] = []
    reads, writes = set(), set()

    def issue(kind, it):
        if it < 4 * NT:
            assert kind == it % 4, (kind, it)
            s = it % NS
            assert s not in pending, ("two refills of one slot in flight", it)
            pending[s] = it
            writes.add(s)
            landed.pop(s, None)
        groups.append(it if it < 4 * NT else None)

    for kind, it in prologue:
        issue(kind, it)
    for c in range(NT):
        for ev in events:
            if ev[0] == "wait":
                assert not reads & writes, ("a slot read and refilled in one interval", c, reads & writes)
                reads, writes = set(), set()
                for it in groups[:len(groups) - (NS - ev[1])]:
                    if it is not None and pending.get(it % NS) == it:
                        landed[it % NS] = pending.pop(it % NS)
            elif ev[0] == "read":
                it = 4 * c + ev[1]
                assert landed.get(it % NS) == it, ("read before landing", c, ev, landed)
                reads.add(it % NS)
                if not seen or seen[-1] != it:
                    seen.append(it)
            else:
                issue(ev[1], 4 * c + ev[2] + NS)
    assert not reads & writes, ("a slot read and refilled in one interval", reads & writes)
    return seen


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("stages", [3, 4, 6])
def test_lean_ring_protocol_reads_every_item_landed_and_never_refills_a_slot_in_use(stages: int, fuse: bool):
    """recur_lean's ring (and recur_fuse's, which waits for items 4 c and 4 c + 1 at once, with one group fewer in
    flight, and moves item 1's refill after item 2's barrier), simulated from the rendered waits and refills for 1..5
    chunks: every item read in order, landed, from its slot; no slot refilled in the barrier interval that reads it."""
    p = TDEF.default_params() | {"chunk": 32, "stages": stages, "recur_lean": True, "recur_ldsm": True, "recur_fuse": fuse}
    prologue, events = ring_events(recur_src(p))
    assert prologue == [(s % 4, s) for s in range(stages - 1)]
    assert sum(e[0] == "wait" for e in events) == (3 if fuse else 4)
    assert [e[1] for e in events if e[0] == "wait"] == ([3, 3, 2] if fuse else [2] * 4)  # wait_group NS - 3, NS - 2
    for NT in range(1, 6):
        assert run_ring(prologue, events, stages, NT) == list(range(4 * NT))


def test_ring_simulation_catches_a_refill_of_a_slot_in_use():
    """The simulation's teeth: the fused item waiting as the unfused ones do reads item 4 c + 1 before it lands, and
    item 1's refill left in the fused item overwrites the slot it is reading."""
    p = TDEF.default_params() | {"chunk": 32, "stages": 6, "recur_lean": True, "recur_ldsm": True, "recur_fuse": True}
    prologue, events = ring_events(recur_src(p))
    early = [("wait", 2) if e == ("wait", 3) else e for e in events]
    with pytest.raises(AssertionError, match="read before landing"):
        run_ring(prologue, early, 6, 3)
    i = next(k for k, e in enumerate(events) if e[0] == "issue")  # the fused item's own refill
    j = next(k for k, e in enumerate(events) if e[0] == "issue" and e[2] == 0)  # item 1's, issued in item 2
    moved = events[:i + 1] + [events[j]] + [e for k, e in enumerate(events) if k > i and k != j]
    assert len(moved) == len(events) and moved != events
    with pytest.raises(AssertionError, match="read and refilled in one interval"):
        run_ring(prologue, moved, 6, 3)


def test_recur_fuse_is_items_0_and_1_with_one_state_fragment():
    """The fused item: one state_frag a k-step feeding acc_v (-w) and then acc_o (qg), each in k-step order as
    before, their B fragments by the same ldmatrix groups as recur_ldsm's items 0 and 1 (their words:
    test_recur_ldsm_gives_every_lane_the_scalar_paths_words), v_new packed after; item 2 adds A_qk v_new to acc_o
    after it. So every accumulator sees the same mma sequence: bit-identical. Legal only with recur_lean and
    recur_ldsm."""
    p = TDEF.default_params() | {"chunk": 32, "stages": 6, "u_prefetch": True, "recur_lean": True, "recur_ldsm": True}
    on, off = step_loop(recur_src(p | {"recur_fuse": True})), step_loop(recur_src(p))
    fused = on[on.index("items 0 and 1 fused"):on.index("acquire_f(4 * c + 2)")]
    for line in ["for (int n = 0; n < C / 8; ++n) ldsm_x4(ldsm_addr<K * 2>(sw_s, lk, (8 * n * K + 32 * kp) * 2), b[n]);",
                 "for (int n = 0; n < C / 8; ++n) ldsm_x4(ldsm_addr<K * 2>(sq_s, lk, (8 * n * K + 32 * kp) * 2), bq[n]);",
                 "const unsigned sw_s = slot_s(4 * c), sq_s = slot_s(4 * c + 1);"]:
        assert line in fused, line
    assert fused.count("state_frag(kb, hi, lo);") == 1 and off.count("state_frag(kb, hi, lo);") == 2
    a, b = fused.index("mma_bf16(acc_v[n], hi, b[n][2 * h], b[n][2 * h + 1]);"), fused.index(
        "mma_bf16(acc_o[n], hi, bq[n][2 * h], bq[n][2 * h + 1]);")
    assert fused.index("state_frag(kb, hi, lo);") < a < b < fused.index("va[kb][0] = pack_bf16(")
    assert on.index("mma_bf16(acc_o[n], va[kb], b[0], b[1]);") > on.index("va[kb][0] = pack_bf16(")
    assert on.count("acc_o[n][e] = 0.f;") == 1 and on.count("acc_v[n][e] = un[n][e];") == 1
    c = PREFILL_CELLS[0]
    for lean, ldsm in product([False, True], repeat=2):
        q = p | {"recur_lean": lean, "recur_ldsm": ldsm, "recur_fuse": True}
        assert TDEF.violations(q, ARCH, c.dtypes_dict(), c.dims_dict()) == ([] if lean and ldsm else ["fuse_on_lean_ldsm"])


# sha256 of the 1376 recur_ldsm renders (recur_fuse off; the other keys in product order, on PREFILL_CELLS[0]) of the
# template before recur_fuse existed: with it off, recur_ldsm's code is unchanged
def test_recur_fuse_legality():
    """recur_fuse is legal exactly at the points with recur_lean and recur_ldsm on (280, 35 recurrences)."""
    c = PREFILL_CELLS[0]
    legal = legal_before_prep_options(c)
    on = [p for p in legal if p["recur_fuse"]]
    base = [p for p in legal if p["recur_lean"] and p["recur_ldsm"] and not p["recur_fuse"]]
    assert len(on) == len(base) == 280 and len({recur_key(p) for p in on}) == 35
    assert sorted(map(str, on)) == sorted(str(p | {"recur_fuse": True}) for p in base)


def fuse_kernels(c: Cell) -> list[dict]:
    """One legal point per fused recurrence to build: chunk 32 x warps 1, 2, 8 x stages 3, 6 x u_prefetch, state_split
    at warps 8, chunk 64 at warps 2 (14 of the 35, all built spill-free when the option was added)."""
    want = [(32, w, s, False, u) for w in (1, 2, 8) for s in (3, 6) for u in (False, True)]
    want += [(32, 8, 3, True, False), (64, 2, 3, False, False)]
    out = {}
    for p in all_legal(c):
        if p["recur_fuse"] and p["prep_diag"] == "warp_row" and recur_key(p)[:5] in want:
            out.setdefault(recur_key(p), p)
    assert len(out) == len(want)
    return list(out.values())


def test_recur_fuse_points_compile_without_spills():
    """Of the 14 fused recurrences, those holding every chunk, warps, stages, state_split and u_prefetch among them
    build without spills at most 255 registers."""
    c = PREFILL_CELLS[2]
    points = covering(fuse_kernels(c), "chunk", "warps", "stages", "state_split", "u_prefetch")
    regs = {}
    for p, res in zip(points, compile_clean(c, points)):
        assert all(r.regs <= 255 for r in res.values()), (p, res)
        regs[recur_key(p)[:5]] = res["kda_chunk_recur"].regs
    print("fused recur registers (chunk, warps, stages, state_split, u_prefetch):", regs)


def prep_smem(p: dict, K: int, V: int) -> int:
    """kda_chunk_prep's layout, written out: G [C][K] and A [C][C] fp32; with stage_in q and k [C][K], v [C][V]
    bf16 and beta [C] fp32 after A (qs = as + C C 4, ks = qs + C K 2, vs = ks + C K 2, bs = vs + C V 2; prep_v = late
    stages v over q)."""
    C = p["chunk"]
    size = C * K * 4 + C * C * 4
    if p["stage_in"]:  # prep_v = late: v over q (vs = qs, bs = ks + C K 2)
        size += C * K * 2 + C * K * 2 + (C * V * 2 if p.get("prep_v", "early") == "early" else 0) + C * 4
    return size


def one_per_case(points: list[dict], constraints: tuple[str, ...] = ()) -> list[dict]:
    """One point of `points` per combination of the params that the plan's launches (their `when`, grid, block and
    smem) and the named constraints read: what a test of those checks is a function of these params and the cell,
    so the other points repeat a case. Read from the header, so a param an expression starts to read is covered."""
    cons = dict(TDEF.constraints)
    exprs = [cons[n] for n in constraints]
    for d in TDEF.launches:
        exprs += [*d.grid, *d.block, d.smem] + ([d.when] if d.when is not None else [])
    names = [n for n in TDEF.param_names if any(n in e.names for e in exprs)]
    out: dict[tuple, dict] = {}
    for p in points:
        out.setdefault(tuple(p[n] for n in names), p)
    return list(out.values())


def test_prep_smem_is_the_kernels_layout():
    for c in PREFILL_CELLS:
        for p in one_per_case(all_legal(c)):
            launches, _ = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
            assert launches[0].smem == prep_smem(p, c.dim("K"), c.dim("V")) <= MAX_SMEM_PER_BLOCK, p
            assert launches[1].smem == p["stages"] * p["chunk"] * c.dim("K") * 2 <= 48 * 1024, p
    p = TDEF.default_params() | {"stage_in": True}
    assert prep_smem(p, 128, 128) == 98560 and prep_smem(p | {"chunk": 32}, 128, 128) == 45184


def test_prep_smem_constraint_is_the_opt_in_limit():
    """prep_smem_fits_227KB refuses exactly the points whose prep launch would pass 227 KB: none at K = V = 128,
    so wider (hypothetical) K show it, on both sides of the limit and right at it (chunk 64 with stage_in:
    512 K + 33024 bytes, K = 388 in, K = 392 out)."""
    c = PREFILL_CELLS[0]
    seen = set()
    for K in (128, 256, 388, 392, 512, 768, 1024):
        dims = c.dims_dict() | {"K": K}
        for p in one_per_case(all_legal(c), ("prep_smem_fits_227KB",)):
            too_big = prep_smem(p, K, c.dim("V")) > MAX_SMEM_PER_BLOCK
            assert ("prep_smem_fits_227KB" in TDEF.violations(p, ARCH, c.dtypes_dict(), dims)) == too_big, (K, p)
            assert TDEF.plan(p, ARCH, c.dtypes_dict(), dims)[0][0].smem == prep_smem(p, K, c.dim("V"))
            seen.add((p["stage_in"], too_big))
    assert seen == {(False, False), (False, True), (True, False), (True, True)}
    p = TDEF.default_params() | {"stage_in": True}
    assert prep_smem(p, 388, 128) == 231680 <= MAX_SMEM_PER_BLOCK < prep_smem(p, 392, 128) == 233728


def stg_offset(src: str):
    """The staged tiles' swizzle, read from the rendered CUDA (C's ^ >> & << mean the same in Python)."""
    m = re.search(r"int stg\(int t, int c\) \{\n(?:\s*static_assert[^\n]*\n)?\s*return ([^;]+);", src)
    assert m, "no stg() in the stage_in rendering"
    expr = m.group(1)
    assert set(expr) <= set("tcN*+^()&<>2 01234567")
    return lambda t, c, N: eval(expr, {}, {"t": t, "c": c, "N": N})  # noqa: S307 (checked characters)


def wavefronts(addrs: list[int]) -> int:
    """Shared memory wavefronts of one warp's <= 4-byte loads: the most distinct words in one bank."""
    banks: dict[int, set[int]] = {}
    for a in addrs:
        banks.setdefault(a // 4 % 32, set()).add(a // 4)
    return max(len(words) for words in banks.values())


@pytest.mark.parametrize("C", [32, 64])
def test_staged_tile_swizzle(C: int):
    """stg keeps 16-byte pieces whole and in their row (cp.async targets) and is a bijection; the kernel's
    reads of the staged tiles: mma fragments and row-wise passes conflict-free, the transposed k read of
    kgT at most C / 16-way (8-way under the 128-byte swz of the fp32 tiles; the old path read global memory)."""
    src = source(TDEF, PREFILL_CELLS[0], TDEF.default_params() | {"chunk": C, "stage_in": True})
    stg = stg_offset(src)
    K = N = 128
    offs = sorted(stg(t, c, N) for t in range(C) for c in range(N))
    assert offs == list(range(0, 2 * C * N, 2))
    for t, c in product(range(C), range(0, N, 8)):
        assert [stg(t, c + j, N) for j in range(8)] == [stg(t, c, N) + 2 * j for j in range(8)]
        assert stg(t, c, N) // (2 * N) == t
    lanes = range(32)
    frag = max(wavefronts([stg(r + dr + ln // 4, c0 + dc + ln % 4, K) for ln in lanes])
               for r, c0, dr, dc in product(range(0, C, 16), range(0, K, 8), (0, 8), (0, 4)))
    vfrag = max(wavefronts([stg(8 * kb + ds + ln % 4, c8 + ln // 4, N) for ln in lanes])  # v_at(s0, col) of w, u
                for kb, c8, ds in product(range(C // 8), range(0, N, 8), (0, 4)))
    rows = max(wavefronts([stg((i0 + ln) // (K // 2), 2 * ((i0 + ln) % (K // 2)) + d, K) for ln in lanes])
               for i0, d in product(range(0, C * K // 2, 32), (0, 1)))  # the qg pass; the X pass likewise
    kgt = max(wavefronts([stg(2 * ((i0 + ln) % (C // 2)) + d, (i0 + ln) // (C // 2), K) for ln in lanes])
              for i0, d in product(range(0, K * C // 2, 32), (0, 1)))
    assert (frag, vfrag, rows, kgt) == (1, 1, 1, C // 16)


# ---- the template's algorithm, emulated in numpy (ops/kda/emulate_chunk.py) --------------------------------
EMU_CELLS = [cell(BF, 1, 200, 2), cell(BF, 2, 130, 1, hv=2), cell(BF, 3, 1, 2), cell(BF, 2, 3, 2), cell(BF, 1, 64, 1),
             cell(BF, 1, 97, 1)]
MMA_DIAG = {"stage_in": True, "prep_vec": True, "prep_round": "add", "prep_diag": "mma"}
EMU_POINTS = [{"chunk": 64, "state_split": False}, {"chunk": 32, "state_split": False},
              {"chunk": 32, "state_split": True}, {"chunk": 64, "state_split": False, "prep_exp": "fast"},
              {"chunk": 32, "state_split": False, "prep_exp": "fast"},
              {"chunk": 32, "state_split": False, "prep_exp": "fast"} | MMA_DIAG,
              {"chunk": 64, "state_split": False} | MMA_DIAG,
              {"chunk": 32, "state_split": False, "prep_exp": "ex2", "prep_addr": "rowcol"} | MMA_DIAG,
              {"chunk": 64, "state_split": False, "prep_exp": "ex2"} | MMA_DIAG,
              {"chunk": 32, "state_split": False, "prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16"} | MMA_DIAG]


def emu_id(p: dict) -> str:
    return (f"C{p['chunk']}-split{int(p['state_split'])}"
            + {"fast": "-fastexp", "ex2": "-ex2"}.get(p.get("prep_exp"), "")
            + ("-rowcol" if p.get("prep_addr") == "rowcol" else "")
            + ("-mmadiag" if p.get("prep_diag") == "mma" else "") + ("-bf16wu" if p.get("prep_wu") == "bf16" else ""))


def emulate_plain(inputs: dict, scal: dict, c: Cell, p: dict, exp_sign: int = 1) -> tuple[dict, dict]:
    """emulate by batch rows, shaped as emulate_cell: (the inputs, the emulated outputs)."""
    return inputs, emulate(inputs, scal, c, p, exp_sign)


def prefill_tolerance(c: Cell, name: str) -> Tolerance:
    """The tolerance a prefill job holds c to: a one-token cell is one of its gate cells (a decode cell's own
    fp32 final state takes fp32's tolerance, which bf16 tensor-core operands do not meet)."""
    return SPEC.tolerance(Cell.make(c.dtypes_dict(), c.dims_dict() | {"T": max(2, c.dim("T"))}), name)


def emulated_shares(c: Cell, p: dict, cases, emulate_one=emulate_cell):
    """(kind, source, output, sign, ok, share) of the emulation at p on each of cell c's input cases (kind, source,
    inputs) against the float64 reference; both signs of the error bound where p's exp has one (fast, ex2)."""
    scal = SPEC.scalar_values(c)
    for kind, source, inputs in cases:
        want = None
        for sign in (1, -1) if p["prep_exp"] in ("fast", "ex2") else (1,):
            ins, got = emulate_one(inputs, scal, c, p, sign)
            want = SPEC.reference(ins, scal) if want is None else want
            for name in want:
                yield (kind, source, name, sign, *passes(got[name], want[name], prefill_tolerance(c, name)))


@pytest.mark.parametrize("fit", EMU_POINTS, ids=emu_id)
@pytest.mark.parametrize("c", EMU_CELLS, ids=lambda c: c.label())
def test_emulated_template_matches_the_float64_reference(c: Cell, fit: dict):
    """prep_exp = fast with its error bound spent one way, then the other."""
    p = TDEF.default_params() | fit
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    for kind, source, name, sign, ok, share in emulated_shares(c, p, emulation_inputs(c), emulate_plain):
        assert ok and share < 0.85, (kind, source, name, sign, share)


def test_long_sequence_with_decay_near_one_keeps_its_margin():
    """The kind that accumulates error: 2048 tokens of decay ~ 1 - 3e-4 (the whole sequence remembered)."""
    c = cell(BF, 1, 2048, 1)
    inputs = SPEC.make_inputs(c, "decay_near_one", np.random.default_rng(2))
    scal = SPEC.scalar_values(c)
    want = SPEC.reference(inputs, scal)
    for split, exp, sign, bound in ((False, "expf", 1, 0.9), (True, "expf", 1, 0.85), (False, "fast", 1, 0.9),
                                    (False, "fast", -1, 0.9), (False, "ex2", 1, 0.9), (False, "ex2", -1, 0.9)):
        p = TDEF.default_params() | {"chunk": 32, "state_split": split, "prep_exp": exp}
        got = emulate(inputs, scal, c, p | (MMA_DIAG | {"prep_addr": "rowcol"} if exp == "ex2" else {}), sign)
        for name in want:
            ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
            assert ok and share < bound, (split, exp, sign, name, share)
    for sign in (1, -1):  # prep_wu = bf16: Tinv diag(beta) as bf16 hi + lo and k exp(G) as bf16 operands
        p = TDEF.default_params() | MMA_DIAG | {"chunk": 32, "prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16"}
        got = emulate(inputs, scal, c, p, sign)
        for name in want:
            ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
            assert ok and share < 0.9, ("bf16 w, u", sign, name, share)


@pytest.mark.parametrize("bug", ["decay_ref_at_chunk_start", "no_intra_decay", "state_not_decayed"])
def test_emulation_catches_classic_chunking_bugs(bug: str):
    """The check has teeth: each bug of a chunked kernel fails some kind."""
    c = cell(BF, 1, 130, 1)
    p = TDEF.default_params()
    scal = SPEC.scalar_values(c)
    failed = False
    for kind in FILLS:
        inputs = SPEC.make_inputs(c, kind, np.random.default_rng(1))
        want = SPEC.reference(inputs, scal)
        ws = emulate_prep(inputs, c, p, scal["scale"])
        if bug == "decay_ref_at_chunk_start":  # A_qk without the diagonal decay: exp(G_i) only
            ws["aqk"] = ws["aqk"] * 0.5
        elif bug == "no_intra_decay":
            bad = emulate_prep(inputs | {"g": np.zeros_like(inputs["g"])}, c, p, scal["scale"])
            ws = {n: bad[n] if n in ("aqk", "w", "u") else a for n, a in ws.items()}
        else:
            ws["gl"] = np.ones_like(ws["gl"])
        h0 = inputs.get("initial_state", np.zeros((1, 1, 128, 128)))
        got = emulate_recur(ws, h0, c, p)
        failed = failed or not all(passes(got[n], want[n], SPEC.tolerance(c, n))[0] for n in want)
    assert failed


# ---- the real gate on the fake device: the two launches, emulated, through the workspace ----------------

WS_DTYPES = {"qg": BF, "kgT": BF, "w": BF, "aqk": BF, "u": FP32, "gl": FP32}
WS_ARGS = {"ws_qg": "qg", "ws_kg": "kgT", "ws_w": "w", "ws_aqk": "aqk", "ws_u": "u", "ws_gl": "gl"}


def emulated_kernels(c0: Cell, p: dict, bug: str = "") -> dict:
    """The template's two launches as fake kernels: launch 1 writes the workspace (the kernel's flat
    layouts and dtypes) from the bound inputs; launch 2 reads only the workspace and the initial state."""
    def dims(dev: KdaFakeDevice, T: int, H: int, HV: int) -> Cell:
        return cell(c0.dtype("x"), dev.state["grid"][2], T, H, c0.dim("K"), c0.dim("V"), hv=HV)

    def prep(dev: KdaFakeDevice, args: tuple) -> None:
        names = ("q", "k", "v", "g", "beta", *WS_ARGS, "T", "H", "HV", "scale")
        a = {n: v for n, (_, v) in zip(names, args)}
        c = dims(dev, a["T"], a["H"], a["HV"])
        assert dev.state["grid"][:2] == (-(-a["T"] // p["chunk"]), a["HV"])
        B, T, H, HV, K, V = (c.dim(d) for d in ("B", "T", "H", "HV", "K", "V"))
        inputs = {"q": dev.read(a["q"], BF, (B, T, H, K)), "k": dev.read(a["k"], BF, (B, T, H, K)),
                  "v": dev.read(a["v"], BF, (B, T, HV, V)), "g": dev.read(a["g"], FP32, (B, T, HV, K)),
                  "beta": dev.read(a["beta"], BF, (B, T, HV))}
        if bug == "no_decay":
            inputs["g"] = np.zeros_like(inputs["g"])
        ws = emulate_prep(inputs, c, p, a["scale"])
        for arg, name in WS_ARGS.items():
            dev.write(a[arg], WS_DTYPES[name], ws[name].astype(np.float64))

    def recur(dev: KdaFakeDevice, args: tuple) -> None:
        names = (*WS_ARGS, "initial_state", "o", "final_state", "T", "HV")
        a = {n: v for n, (_, v) in zip(names, args)}
        B = dev.state["grid"][2]
        assert dev.state["grid"][:2] == (c0.dim("V") // (16 * p["warps"]), a["HV"])
        c = cell(c0.dtype("x"), B, a["T"], 1, c0.dim("K"), c0.dim("V"), hv=a["HV"])
        B, T, HV, K, V = (c.dim(d) for d in ("B", "T", "HV", "K", "V"))
        nc = B * HV * -(-T // p["chunk"])
        C = p["chunk"]
        shapes = {"qg": (nc, C, K), "kgT": (nc, K, C), "w": (nc, C, K), "aqk": (nc, C, C), "u": (nc, C, V), "gl": (nc, K)}
        ws = {name: dev.read(a[arg], WS_DTYPES[name], shapes[name]).astype(f32) for arg, name in WS_ARGS.items()}
        out = emulate_recur(ws, dev.read(a["initial_state"], FP32, (B, HV, K, V)), c, p)
        dev.write(a["o"], BF, out["o"])
        dev.write(a["final_state"], FP32, out["final_state"])
        dev.clock += SPEC.bytes_moved(c) / 3e6

    return {"kda_chunk_prep": prep, "kda_chunk_recur": recur}


@pytest.mark.parametrize("recur", ["one_warp", "ksplit_carry"])
@pytest.mark.parametrize("bug", ["", "no_decay"])
def test_the_gate_runs_chunk_jobs_end_to_end_on_the_fake_device(bug: str, recur: str):
    """make_job's kda job for the chunk template (two launches, six workspaces, gate cells of T = 1 and 3)
    through the real Gate with the emulated launches: OK, and WRONG_ANSWER with a bug; with the one-warp-a-column
    recurrence and the K-split carry one."""
    from evo.measure.evaluate import make_job
    from evo.measure.evaluators import gate_cells_for
    from evo.measure.jobs import Timing

    c = cell(BF, 2, 70, 2)
    p = TDEF.default_params() | {"chunk": 32}
    if recur == "ksplit_carry":
        p |= {"kwarps": 2, "recur_addr": "carry"}
    g = Genome.make("kda", "chunk", TDEF.source_hash, p)
    gates = gate_cells_for(SPEC, TDEF, g, c, ARCH)
    assert {(x.dim("B"), x.dim("T")) for x in gates} >= {(1, 1), (3, 1), (2, 3)}
    build = compile_point(c, p)
    assert build.status.ok, build.error
    # a few samples: each replays the emulated graph (graph_launches launches), and the gate's path is the same
    job = make_job(SPEC, TDEF, g, build, c, ARCH, seed=3, timing=Timing(min_samples=5, max_samples=5, warmup=1),
                   baseline=False, gate_cells=gates, stress_launches=1)
    assert set(job.left_out) == {"A_log", "dt_bias", "cu_seqlens"}
    assert [ln.kernel for ln in job.launches] == ["kda_chunk_prep", "kda_chunk_recur"]
    assert not any(ln.pdl for ln in job.launches)
    dev = KdaFakeDevice(emulated_kernels(c, p, bug))
    gate_on_fake(dev, job, g, c, build, bug)
    assert dev.launches > 0 and dev.pdl_kernels == []


def test_variant_of_prefill_cells_is_fla_default():
    assert all(variant_of(c) == Variant() for c in PREFILL_CELLS)


# ---- varlen: cu_seqlens, B = 1, N sequences ------------------------------------------------------------

VARLEN = cell(BF, 1, 8192, 32, n=8)  # the matrix's varlen shape in fla's default call (the chunk template's variant)




def test_varlen_cells_are_served_and_plans_cover_their_slots():
    """A varlen cell of fla's default call is admitted; the prep grid and workspaces hold ceil(T / C) + N - 1
    slots a value head (N - B = 0 leaves equal-length plans as they were); the recurrence runs per sequence.
    The matrix's varlen cell is the model's call (raw gate, beta logits, L2 norm, V-first): served too
    (test_model_call_varlen_cell_is_served_and_compiles_clean)."""
    matrix_varlen = [c for c in SPEC.matrix() if is_varlen(c)]
    assert len(matrix_varlen) == 1 and TDEF.violations(
        TDEF.default_params(), ARCH, matrix_varlen[0].dtypes_dict(), matrix_varlen[0].dims_dict()) == []
    for c in (VARLEN, cell(BF, 1, 7, 2, n=3), cell(BF, 1, 5, 1, n=5), *gate_cells(VARLEN)):
        assert is_varlen(c)
        for p in legal_points(c, 6, seed=4):
            assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
            launches, ws = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
            slots = -(-c.dim("T") // p["chunk"]) + c.dim("N") - 1
            assert launches[0].grid == (slots, c.dim("HV"), 1)
            assert launches[1].grid == (c.dim("V") // (16 * p["warps"]), c.dim("HV"), c.dim("N"))
            assert ws["ws_u"] == 4 * c.dim("HV") * slots * p["chunk"] * c.dim("V")
            assert launches[0].args[15:] == ("cu_seqlens?", "N", *PREP_VARIANT_ARGS) and launches[1].args[-1] == "cu_seqlens?"


@pytest.mark.parametrize("C", [32, 64])
def test_varlen_slots_hold_every_chunk_of_every_sequence_once(C: int):
    """Launch 1's slots: each sequence's ceil(len / C) chunks exactly once, in order, from cu[n] / C + n on
    (where launch 2 reads them), never crossing a sequence boundary, within the planned slot count."""
    rng = np.random.default_rng(C)
    cases = [np.array([0, 1]), np.array([0, C]), np.array([0, C, 2 * C]), np.array([0, 1, 2, 3, 3 * C + 5])]
    for _ in range(300):
        n = int(rng.integers(1, 40))
        lengths = rng.integers(1, rng.choice([3, C + 2, 4 * C]), n)
        cases.append(np.concatenate([[0], np.cumsum(lengths)]))
    for cu in cases:
        slots = varlen_slots(cu, C)
        assert len(slots) == -(-int(cu[-1]) // C) + len(cu) - 2
        for n in range(len(cu) - 1):
            bos, ln = int(cu[n]), int(cu[n + 1] - cu[n])
            mine = [(i, s) for i, s in enumerate(slots) if s is not None and s[0] == n]
            assert [i for i, _ in mine] == list(range(bos // C + n, bos // C + n + -(-ln // C)))
            assert [(t, k) for _, (_, t, k) in mine] == [(bos + j, min(C, ln - j)) for j in range(0, ln, C)]


def test_varlen_renders_the_same_code_and_compiles_clean():
    """varlen is a runtime switch (cu_seqlens null or not): a varlen cell renders the code of an equal-length
    cell of the same K, V; its builds (the points of a sample of the space that hold every value it draws) have no
    spills, stack or static smem."""
    points = legal_points(VARLEN, 8, seed=5) + [TDEF.default_params() | q for q in (
        {"chunk": 32, "stage_in": True, "prep_threads": 256, "recur_lean": True, "state_split": True, "stages": 4,
         "warps": 1},
        MMA_DIAG | {"chunk": 64, "u_prefetch": False, "recur_lean": True})]
    for p in points:
        assert TDEF.is_valid(p, ARCH, VARLEN.dtypes_dict(), VARLEN.dims_dict()), p
        assert source(TDEF, VARLEN, p) == source(TDEF, PREFILL_CELLS[0], p)
    for res in compile_clean(VARLEN, covering(points, *TDEF.param_names)):
        assert set(res) == {"kda_chunk_prep", "kda_chunk_recur"}




VARLEN_EMU_CELLS = [cell(BF, 1, 200, 2, n=4), cell(BF, 1, 130, 1, n=3, hv=2), cell(BF, 1, 7, 2, n=3),
                    cell(BF, 1, 97, 1, n=1)]


@pytest.mark.parametrize("fit", EMU_POINTS[:3], ids=emu_id)
@pytest.mark.parametrize("c", VARLEN_EMU_CELLS, ids=lambda c: c.label())
def test_emulated_varlen_matches_the_float64_reference(c: Cell, fit: dict):
    """Every fill kind (uneven lengths) and the varlen kind (sequences of 1..3 tokens beside a long one),
    from make_inputs and the gate's device fill, against the float64 reference with cu_seqlens (a cell of one
    sequence given cu_seqlens = [0, T] where its inputs have none)."""
    p = TDEF.default_params() | fit
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    scal = SPEC.scalar_values(c)
    cases = [*emulation_inputs(c), ("varlen", "make_inputs", SPEC.make_inputs(c, "varlen", np.random.default_rng(4)))]
    for kind, src, inputs in cases:
        assert "cu_seqlens" in inputs or not is_varlen(c), (kind, src)
        inputs = {"cu_seqlens": np.array([0, c.dim("T")])} | inputs  # N = B = 1: cu_seqlens = [0, T] is the same batch
        want = SPEC.reference(inputs, scal)
        got = emulate_varlen(inputs, scal, c, p)
        for name in want:
            ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
            assert ok and share < 0.85, (kind, src, name, share)


def test_varlen_emulation_catches_chunks_that_cross_sequences():
    """The check has teeth: treating the packed batch as one sequence (no cu_seqlens) fails."""
    c = cell(BF, 1, 130, 1, n=3)
    inputs = SPEC.make_inputs(c, "normal", np.random.default_rng(5))
    want = SPEC.reference(inputs, SPEC.scalar_values(c))
    one = cell(BF, 1, 130, 1)
    flat = {k: v for k, v in inputs.items() if k not in ("cu_seqlens", "initial_state")} | {
        "initial_state": inputs["initial_state"][:1]}
    got = emulate(flat, SPEC.scalar_values(one), one, TDEF.default_params())
    assert not passes(got["o"], want["o"], SPEC.tolerance(c, "o"))[0]


# ---- fla's variants: gate, beta_act, qk_l2norm, v_first (compile-time consts) -------------------------------
# Launch 1 forms them where it reads its inputs (the raw gate's log decay on g's load, before the cumulative
# sum; the activated beta once a token; q, k times their tokens' inverse L2 norms), launch 2 reads and writes
# the state [V, K] with v_first. The emulation does the same in fp32 (variant_prep), then launch 1 as before.

PREP_VARIANT_ARGS = ("A_log?", "dt_bias?", "lower_bound")
MODEL_VARLEN = [c for c in SPEC.matrix() if is_varlen(c)][0]  # the model's call: B = 1, N = 8, T = 8192, H = 32
ALL_ON = Variant(Gate.LOWER_BOUND, BetaAct.SIGMOID2, True, True)
VARIANT_CELLS = [
    cell(BF, 2, 130, 1, hv=2, variant=Variant(beta_act=BetaAct.SIGMOID)),
    cell(BF, 1, 97, 2, variant=Variant(beta_act=BetaAct.SIGMOID2)),
    cell(BF, 2, 70, 2, variant=Variant(qk_l2norm=True)),
    cell(BF, 1, 130, 1, g=BF, variant=Variant(Gate.SOFTPLUS)),
    cell(BF, 2, 33, 1, variant=Variant(Gate.SOFTPLUS)),
    cell(BF, 1, 100, 2, variant=Variant(Gate.LOWER_BOUND)),
    cell(BF, 2, 64, 1, variant=Variant(v_first=True)),
    cell(BF, 1, 200, 2, n=4, g=BF, variant=MODEL),
    cell(BF, 1, 130, 2, n=3, hv=4, g=BF, variant=ALL_ON),
]


def variant_inputs(c: Cell):
    """emulation_inputs with the raw gate's A_log and dt_bias kept where the cell's gate reads them (make_inputs'
    and the device fill's), and the varlen kind on B = 1 cells."""
    from tests.unit.test_kda_recurrent import device_fill

    for kind in FILLS:
        yield kind, "make_inputs", SPEC.make_inputs(c, kind, np.random.default_rng(1))
        fill = device_fill(c, kind)
        yield kind, "gate fill", {n: a for n, a in fill.items() if raw_gate(c) or n not in ("A_log", "dt_bias")}
    if c.dim("B") == 1:
        yield "varlen", "make_inputs", SPEC.make_inputs(c, "varlen", np.random.default_rng(4))




@pytest.mark.parametrize("fit", EMU_POINTS[:4] + [EMU_POINTS[7], EMU_POINTS[9]], ids=emu_id)
@pytest.mark.parametrize("c", VARIANT_CELLS, ids=lambda c: c.label())
def test_emulated_variants_match_the_float64_reference(c: Cell, fit: dict):
    """Each variant alone, the model's call and every switch on: every kind, from make_inputs and the device fill,
    within 0.85 of the tolerance (prep_exp = fast with its error spent both ways)."""
    p = TDEF.default_params() | fit
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    for kind, src, name, sign, ok, share in emulated_shares(c, p, variant_inputs(c)):
        assert ok and share < 0.85, (kind, src, name, sign, share)


@pytest.mark.parametrize("switch", ["gate", "beta_act", "qk_l2norm", "v_first"])
def test_variant_emulation_catches_a_skipped_variant(switch: str):
    """The check has teeth: the kernel's arithmetic with one switch left out (the raw g taken as the log decay,
    logits as beta, q and k unnormalized, the state read K-first) fails some kind."""
    c = cell(BF, 1, 130, 2, n=3, hv=4, g=BF, variant=Variant(Gate.SOFTPLUS, BetaAct.SIGMOID2, True, True))
    off = {"gate": Gate.LOG, "beta_act": BetaAct.NONE, "qk_l2norm": False, "v_first": False}[switch]
    var = variant_of(c)
    bad = cell(BF, 1, 130, 2, n=3, hv=4, g=BF, variant=Variant(**{
        f: (off if f == switch else getattr(var, f)) for f in ("gate", "beta_act", "qk_l2norm", "v_first")}))
    scal = SPEC.scalar_values(c)
    p = TDEF.default_params()
    failed = []
    for kind in FILLS:
        inputs = SPEC.make_inputs(c, kind, np.random.default_rng(1))
        want = SPEC.reference(inputs, scal)
        assert all(passes(emulate_varlen(inputs, scal, c, p)[n], want[n], SPEC.tolerance(c, n))[0] for n in want)
        with np.errstate(all="ignore"):  # a raw g of either sign taken as the log decay overflows exp
            got = emulate_varlen(inputs, SPEC.scalar_values(bad), bad, p)
        failed += [kind for n in want if not passes(got[n], want[n], SPEC.tolerance(c, n))[0]]
    assert failed, switch


def test_variant_plans_bind_the_raw_gate_tensors():
    """A_log and dt_bias are bound on raw-gate cells and null elsewhere (the prep launch's last args, lower_bound
    after them); beta_act or qk_l2norm add 3 C fp32 to the prep launch's smem."""
    from evo.measure.evaluate import bind_cell

    for c in (MODEL_VARLEN, cell(BF, 2, 64, 2, variant=Variant(Gate.LOWER_BOUND)),
              cell(BF, 2, 64, 2, variant=Variant(beta_act=BetaAct.SIGMOID, qk_l2norm=True)),
              cell(BF, 2, 64, 2, variant=Variant(v_first=True)), PREFILL_CELLS[0]):
        for p in (TDEF.default_params(), TDEF.default_params() | {"chunk": 32, "stage_in": True}):
            var = variant_of(c)
            genome = Genome.make("kda", "chunk", TDEF.source_hash, p)
            launches, buffers, _ = bind_cell(SPEC, TDEF, genome, c, ARCH)
            names = {b.name for b in buffers}
            raw = var.gate is not Gate.LOG
            assert ({"A_log", "dt_bias"} <= names) == raw and ({"A_log", "dt_bias"} & names) == ({"A_log", "dt_bias"} if raw else set())
            tail = launches[0].args[-3:]
            assert tail[:2] == ((("buf", "A_log"), ("buf", "dt_bias")) if raw else (("ptr", 0), ("ptr", 0))), tail
            assert tail[2][0] == "f32" and tail[2][1] == LOWER_BOUND
            extra = 12 * p["chunk"] if var.beta_act is not BetaAct.NONE or var.qk_l2norm else 0
            assert launches[0].smem == prep_smem(p, c.dim("K"), c.dim("V")) + extra


VARIANT_BUILDS = [  # (cell, point): each variant's own code paths (the model's call, every switch on, builds the
    (cell(BF, 2, 64, 2, variant=Variant(Gate.SOFTPLUS)), {}),  # q/k norm with the mma diagonal too)
    (cell(BF, 2, 64, 2, g=BF, variant=Variant(Gate.LOWER_BOUND)), {}),
    (cell(BF, 2, 64, 2, variant=Variant(beta_act=BetaAct.SIGMOID2)), {"chunk": 32, "stage_in": True}),
    (cell(BF, 2, 64, 2, variant=Variant(qk_l2norm=True)), {}),
    (cell(BF, 2, 64, 2, variant=Variant(v_first=True)), {"chunk": 32, "state_split": True}),
]
MODEL_POINTS = [{}, {"stage_in": True}, MMA_DIAG | {"chunk": 32},
                {"chunk": 32, "u_prefetch": True, "state_split": True, "warps": 4, "stages": 6, "prep_exp": "fast"}]


def test_model_call_varlen_cell_is_served_and_compiles_clean():
    """The matrix's varlen cell (the model's call: raw gate on bf16 g, beta logits, q/k L2 norm, V-first state)
    and its gate cells are admitted at the default point; its builds, and each variant's own, have no spills,
    stack or static smem."""
    c = MODEL_VARLEN
    assert variant_of(c) == MODEL and c.dtype("g") == BF
    assert TDEF.violations(TDEF.default_params(), ARCH, c.dtypes_dict(), c.dims_dict()) == []
    for gc in gate_cells(c):
        assert TDEF.violations(TDEF.default_params(), ARCH, gc.dtypes_dict(), gc.dims_dict()) == [], gc.label()
    points = [TDEF.default_params() | q for q in MODEL_POINTS]
    for p in points:
        assert TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()), p
    for res in compile_clean(c, points):
        assert set(res) == {"kda_chunk_prep", "kda_chunk_recur"}
    for vc, q in VARIANT_BUILDS:
        p = TDEF.default_params() | q
        assert TDEF.is_valid(p, ARCH, vc.dtypes_dict(), vc.dims_dict()), (vc.label(), p)
        compile_clean(vc, [p])


def test_variant_renders_differ_only_behind_their_switches():
    """A variant's code is behind its compile-time const: fla's default call renders no variant code (no A_log
    read, no sigmoid, no norm, no [V, K] state), and each switch adds its own."""
    base = source(TDEF, PREFILL_CELLS[0], TDEF.default_params())
    for frag in ("A_log[hv]", "act(", "qk_raw", "(long long)vr * K"):
        assert frag not in base
    for var, frag in ((Variant(Gate.SOFTPLUS), "log1pf"), (Variant(Gate.LOWER_BOUND), "lower_bound * "),
                      (Variant(beta_act=BetaAct.SIGMOID2), "2.0f / (1.0f + expf(-x))"),
                      (Variant(qk_l2norm=True), "qk_raw"), (Variant(v_first=True), "(long long)vr * K")):
        assert frag in source(TDEF, cell(BF, 2, 64, 2, variant=var), TDEF.default_params()), var


def test_the_varlen_experiment_searches_the_matrix_model_cell_over_legal_points():
    """experiments/kda_varlen_h200.toml: its one cell is the matrix's varlen batch in the model's call (the
    named matrix "varlen"), and its narrowed space holds legal points for it, the recur_lean and recur_fuse ones too."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session
    from memory.store import Store
    from ops.kda.spec import varlen_matrix

    cfg = load_config(Path(__file__).resolve().parents[2] / "experiments" / "kda_varlen_h200.toml")
    with Store.open(":memory:") as s:
        ses = Session(cfg, s, "check")
        (c,) = ses.cells
        assert c.label() == varlen_matrix()[0].label() and c in SPEC.matrix()
        assert variant_of(c) == MODEL and c.dim("N") == 8 and c.dim("B") == 1
        legal = all_legal(c, ses.templates["chunk"])
    assert len(legal) >= 32, len(legal)
    assert any(p["recur_lean"] for p in legal) and any(p["recur_fuse"] for p in legal)


def test_the_long_experiment_searches_the_few_head_long_cells_over_legal_points():
    """experiments/kda_prefill_long.toml: its cells are the named matrix "long" (few heads, long sequences), with
    legal points of its space on each."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session
    from memory.store import Store
    from ops.kda.spec import LONG_FEW_HEADS, long_matrix

    cfg = load_config(Path(__file__).resolve().parents[2] / "experiments" / "kda_prefill_long.toml")
    with Store.open(":memory:") as s:
        ses = Session(cfg, s, "check")
        assert [c.label() for c in ses.cells] == [c.label() for c in long_matrix()]
        assert [(c.dim("B"), c.dim("T"), c.dim("H")) for c in ses.cells] == list(LONG_FEW_HEADS)
        for c in ses.cells:
            assert len(all_legal(c, ses.templates["chunk"])) >= 32, c.label()


# The counts: each config's space less the points of the options it offered that measured slower and left the template
# (docs/kda_prep_analysis.md): kda_prefill_h200_t8192.toml's 116 held every point at prep_aoff one and two (58 each);
# kda_prefill_h200.toml's 2288 held, beside its 1232, the 704 points at 128 threads again at prep_aoff two and the 352
# of those with rowcol offsets and v staged early again at prep_aref chunk; kda_prefill_h200_focus.toml's 2110 (prep_u,
# pdl and prep_aoff unrestricted there, prep_aref block or chunk) held 495 at fp32 u, pdl off, aoff one, aref block.
@pytest.mark.parametrize("name, cells, points", [("kda_prefill_h200_t8192.toml", 1, 116 // 2),
                                                 ("kda_prefill_h200.toml", 4, 2288 - 704 - 352),
                                                 ("kda_prefill_h200_focus.toml", 2, 495)])
def test_prefill_configs_hold_the_legal_points_their_comments_state(name: str, cells: int, points: int):
    """The prefill GA configs' narrowed spaces hold, on each of their cells, the number of legal points that the
    configs' comments state."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session
    from memory.store import Store

    path = Path(__file__).resolve().parents[2] / "experiments" / name
    comment = " ".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))
    assert f"{points}" in comment
    cfg = load_config(path)
    with Store.open(":memory:") as s:
        ses = Session(cfg, s, "check")
        assert len(ses.cells) == cells
        t = ses.templates["chunk"]
        for c in ses.cells:
            legal = t.legal_points(ARCH, c.dtypes_dict(), c.dims_dict())
            assert len(legal) == points, c.label()


# ---- prep_round: tf32 by one integer add ---------------------------------------------------------------------

def tf32_add(x: np.ndarray) -> np.ndarray:
    """prep_round = add as the kernel does it, read as the tensor core reads a tf32 operand: the bit pattern plus
    0x1000, its low 13 bits dropped."""
    b = (x.astype(np.float32).view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return b.view(np.float32)


def tf32_rna(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 from its definition: to 10 mantissa bits, the nearest, ties away from zero (float64); a
    subnormal keeps the bit positions of the smallest normal binade (its place 2^-136)."""
    x64 = x.astype(np.float64)
    _, e = np.frexp(np.abs(x64))  # |x| = m 2^e, m in [0.5, 1): tf32's last place is 2^(e - 11)
    q = 2.0 ** (np.maximum(e, -125) - 11)
    r = np.floor(np.abs(x64) / q + 0.5) * q
    return np.copysign(r, x64).astype(np.float32)


def test_prep_round_add_is_cvt_rna_on_finite_values():
    """The add rounds half away from zero to tf32 exactly as cvt.rna: random values over 80 binades, both signs,
    and the hard cases (exact ties up and down, the carry into the exponent, subnormals, zero)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(200_000) * 2.0 ** rng.integers(-40, 40, 200_000)).astype(np.float32)
    base = rng.integers(0, 2**31, 20_000, dtype=np.uint32) & np.uint32(0x7F7FE000)  # finite, tf32-exact
    ties = [base | np.uint32(0x1000), base | np.uint32(0x0FFF), base | np.uint32(0x1001), base | np.uint32(0x1FFF)]
    special = np.array([0x00000000, 0x00000001, 0x00001000, 0x007FF000, 0x3F7FF000, 0x3FFFF000, 0x3F801000,
                        0x7F7FE000], dtype=np.uint32)
    for bits in (*ties, special):
        for sign in (np.uint32(0), np.uint32(0x80000000)):
            x = np.concatenate([x, (bits | sign).view(np.float32)])
    got, want = tf32_add(x), tf32_rna(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.abs(got.astype(np.float64) - x).max() <= np.abs(x.astype(np.float64)).max() * 2.0**-11


def test_prep_round_renders_and_builds_spill_free():
    """prep_round = add replaces every cvt.rna of launch 1 by the add (launch 2 has none) and builds spill-free, in
    fla's default call and (each rounding once) the model's call."""
    base = TDEF.default_params() | {"chunk": 32, "warps": 2, "stages": 6, "prep_threads": 256, "stage_in": True,
                                    "u_prefetch": True, "recur_lean": True, "recur_ldsm": True}
    c = PREFILL_CELLS[0]
    cvt, add = source(TDEF, c, base), source(TDEF, c, base | {"prep_round": "add"})
    assert 'asm("cvt.rna.tf32.f32' in cvt and 'asm("cvt.rna' not in add and "+ 0x1000u" in add
    assert add.split("kda_chunk_recur(", 1)[1] == cvt.split("kda_chunk_recur(", 1)[1]  # launch 2 untouched
    points = [base | {"prep_round": r} for r in ("cvt", "add")] + [base | {"prep_round": "add", "prep_exp": "fast"}]
    for cc in (c, MODEL_VARLEN):
        for p in points:
            assert TDEF.is_valid(p, ARCH, cc.dtypes_dict(), cc.dims_dict()), (cc.label(), p)
        compile_clean(cc, points if cc is c else covering(points, "prep_round"))


# ---- prep_vec: the elementwise outputs eight elements a thread -------------------------------------------------

def test_prep_vec_is_legal_exactly_with_stage_in_and_off_renders_the_scalar_loops():
    """prep_vec reads the staged tiles: refused without stage_in, legal at every stage_in point; off, the scalar
    loops render as before (the digests above); on, the q exp(G) and k exp(G_last - G) stores are 16-byte and
    X is written as float4, the rest of launch 1 and all of launch 2 unchanged."""
    c = PREFILL_CELLS[0]
    legal = [p for p in all_legal(c) if p["prep_diag"] != "mma"]  # (mma needs prep_vec: test_mma_diag_legality)
    on = [p for p in legal if p["prep_vec"]]
    assert sorted(map(str, on)) == sorted(str(p | {"prep_vec": True}) for p in legal if p["stage_in"] and not p["prep_vec"])
    p = TDEF.default_params() | {"prep_vec": True}
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == ["prep_vec_reads_staged_tiles"]
    base = TDEF.default_params() | {"chunk": 32, "warps": 2, "stages": 6, "prep_threads": 128, "stage_in": True,
                                    "u_prefetch": True, "recur_lean": True, "recur_ldsm": True, "prep_round": "add",
                                    "prep_exp": "fast"}
    off, vec = source(TDEF, c, base), source(TDEF, c, base | {"prep_vec": True})
    assert off.split("kda_chunk_recur(", 1)[1] == vec.split("kda_chunk_recur(", 1)[1]
    assert "ws_qg + (cidx * C + t) * K + c) = make_uint4(" in vec and "ws_kg + (cidx * K + c) * C + t) = make_uint4(" in vec
    assert "*p0 = make_float4(" in vec and "make_uint4" not in off
    assert "G_AT(t, c) = beta_at(t) * qk_at(" in off and "G_AT(t, c) = beta_at(t) * qk_at(" not in vec


def test_prep_vec_covers_each_output_once():
    """The vectorized loops' index math (as rendered) gives every (t, c) of q exp(G), k exp(G_last - G) and X
    to exactly one thread and step, for chunk 32 and 64 and 128 and 256 threads."""
    for C in (32, 64):
        K = 128
        for PT in (128, 256):
            qg, kg = np.zeros((C, K), int), np.zeros((K, C), int)
            for tid in range(PT):
                for i in range(tid, C * K // 8, PT):
                    t, c = i // (K // 8), 8 * (i % (K // 8))
                    qg[t, c:c + 8] += 1
                for i in range(tid, K * C // 8, PT):
                    c, t = i // (C // 8), 8 * (i % (C // 8))
                    kg[c, t:t + 8] += 1
            assert (qg == 1).all() and (kg == 1).all(), (C, PT)


def test_prep_vec_builds_spill_free_in_both_calls():
    """prep_vec at the GA's point (prep_round add, fast exp) at 128 and 256 threads and at chunk 64 builds
    without spills, stack or static smem in fla's default call, and at chunk 64 and the GA's point at 256 threads (each
    chunk and threads once) in the model's call (q/k L2 norm, beta logits, raw gate), at the scalar loops' occupancy."""
    base = TDEF.default_params() | {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True,
                                    "recur_lean": True, "recur_ldsm": True, "prep_round": "add", "prep_exp": "fast",
                                    "prep_vec": True}
    points = [base | {"prep_threads": 128}, base | {"prep_threads": 256},
              TDEF.default_params() | {"chunk": 64, "stage_in": True, "prep_vec": True}]
    for cc in (PREFILL_CELLS[0], MODEL_VARLEN):
        for p in points:
            assert TDEF.is_valid(p, ARCH, cc.dtypes_dict(), cc.dims_dict()), (cc.label(), p)
        pts = points if cc is PREFILL_CELLS[0] else points[1:]
        for p, res in zip(pts, compile_clean(cc, pts)):
            scalar = compile_point(cc, p | {"prep_vec": False})
            assert prep_ctas_per_sm(p, res["kda_chunk_prep"].regs) == prep_ctas_per_sm(
                p, dict(scalar.resources)["kda_chunk_prep"].regs), (cc.label(), p)


# ---- prep_diag = mma: the diagonal blocks by tf32 mma.sync, the exact path where a chunk's decay is wide -----------

def test_mma_diag_legality():
    """mma is offered on the vectorized prep with the one-add tf32 rounding only: one more point for each such
    warp_row point, refused elsewhere by its own constraint."""
    c = PREFILL_CELLS[0]
    legal = all_legal(c, ksplit=True)
    on = [p for p in legal if p["prep_diag"] == "mma"
          and p["prep_exp"] != "ex2" and p["prep_addr"] == "swz"]  # (ex2, rowcol: test_ex2_rowcol_legality)
    base = [p for p in legal if p["prep_diag"] == "warp_row" and p["prep_vec"] and p["prep_round"] == "add"]
    assert on and sorted(map(str, on)) == sorted(str(p | {"prep_diag": "mma"}) for p in base)
    p = TDEF.default_params() | {"stage_in": True, "prep_diag": "mma"}
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == ["mma_diag_on_the_vec_prep"]
    assert TDEF.violations(p | {"prep_vec": True}, ARCH, c.dtypes_dict(), c.dims_dict()) == ["mma_diag_on_the_vec_prep"]
    assert TDEF.violations(p | MMA_DIAG, ARCH, c.dtypes_dict(), c.dims_dict()) == []


def test_mma_diag_renders_both_paths_and_leaves_the_rest():
    """The rendered prep holds the flag (found at the barrier after the decay's sum), the tensor-core diagonal and
    warp_row's exact diagonal as its fallback; launch 2 is the warp_row point's."""
    c = PREFILL_CELLS[0]
    base = TDEF.default_params() | {"chunk": 32, "prep_threads": 128, "warps": 2, "stages": 6, "prep_exp": "fast"} | MMA_DIAG
    mma, row = source(TDEF, c, base), source(TDEF, c, base | {"prep_diag": "warp_row"})
    assert mma.split("kda_chunk_recur(", 1)[1] == row.split("kda_chunk_recur(", 1)[1]
    prep = mma.split("kda_chunk_recur(", 1)[0]
    assert "const bool wide = __syncthreads_or(wide_here) != 0;" in prep and "constexpr float DIAG_RANGE = 60.f;" in prep
    fallback, tensor = prep.split("if (wide) {", 1)[1].split("} else {", 1)
    assert "warp_sum(skk)" in fallback and "mma_tf32(akk[n], fk, b0, b1);" in tensor
    assert prep.count("mma_tf32(akk[n], fk, b0, b1);") == 2  # the diagonal's and the off-diagonal blocks'
    assert f"DIAG_RANGE = {DIAG_RANGE:g}.f" in prep  # the emulator's bound is the kernel's


def test_mma_diag_takes_the_exact_path_exactly_where_the_factors_would_overflow():
    """On the gate's kinds: normal, decay_near_one and beta_large chunks take the tensor-core diagonal, decay_near_zero
    chunks (log decay ~ -12 a token) and gate_at_bound ones (-5 a token: a 16-token block spans 80 > DIAG_RANGE) the
    exact one, decay_at_factor_limit's (blocks spanning 97-102% of DIAG_RANGE) mostly the tensor-core one at its
    largest factors; forcing the tensor-core diagonal on decay_near_zero overflows (non-finite or out of tolerance),
    and the emulated template with the flag stays within tolerance everywhere."""
    c = cell(BF, 1, 200, 2)
    scal = SPEC.scalar_values(c)
    p = TDEF.default_params() | {"chunk": 32, "prep_exp": "fast"} | MMA_DIAG
    seen = set()
    for kind, src, inputs in emulation_inputs(c):
        pre = variant_prep(inputs, c, scal["lower_bound"])
        g = np.zeros((1, 224, 2, 128), f32)
        g[:, :200] = pre["g"]
        G = np.cumsum(np.moveaxis(g.reshape(1, 7, 32, 2, 128), 3, 1), axis=3, dtype=f32)
        wide = diag_is_wide(G)
        if kind == "gate_at_bound":  # every full chunk; the last one's 8 tokens span 40
            assert wide[..., :6].all() and not wide[..., 6].any(), (kind, src, wide)
        elif kind == "decay_at_factor_limit":  # blocks spanning just under DIAG_RANGE: the diagonal by tensor cores
            blocks = G[:, :, :6].reshape(1, 2, 6, 2, 16, 128)  # with factors near exp(60), a chunk past it exactly
            span = np.abs(blocks - blocks[..., :1, :]).max(axis=(-2, -1))
            assert (span > 0.97 * DIAG_RANGE).all() and (span < 1.02 * DIAG_RANGE).all(), (src, span)
            assert not wide[..., :6].all() and not wide[..., 6].any(), (src, wide)
        else:
            assert wide.all() if kind == "decay_near_zero" else not wide.any(), (kind, src, wide)
        seen.add(bool(wide.any()))
        want = SPEC.reference(inputs, scal)
        got = emulate(inputs, scal, c, p, 1)
        assert all(passes(got[n], want[n], SPEC.tolerance(c, n))[0] for n in want), (kind, src)
        if kind == "decay_near_zero":
            with pytest.MonkeyPatch.context() as mp:  # the flag forced off
                mp.setattr(emulate_chunk, "diag_is_wide", lambda G: np.zeros(G.shape[:-2], bool))
                forced = emulate(inputs, scal, c, p, 1)
            assert not all(passes(forced[n], want[n], SPEC.tolerance(c, n))[0] for n in want), src
    assert seen == {True, False}


def test_mma_diag_builds_spill_free_at_the_warp_row_occupancy():
    """The mma prep kernel at every (chunk 32, 64) x (128, 256 threads) and every prep_exp at each chunk (4 of the 8)
    builds for sm_90a without spills, stack or static smem, in fla's default call, and at the fast exp at each chunk and
    threads in the model's (q/k L2 norm, beta logits, raw gate), at the warp_row prep's CTAs an SM."""
    base = TDEF.default_params() | {"warps": 2, "stages": 3} | MMA_DIAG
    points = [base | {"chunk": ch, "prep_threads": pt, "prep_exp": ex}
              for ch in (32, 64) for pt in (128, 256) for ex in ("expf", "fast")]
    for cc in (PREFILL_CELLS[0], MODEL_VARLEN):
        pts = (covering(points, lambda p: (p["chunk"], p["prep_threads"]), lambda p: (p["chunk"], p["prep_exp"]))
               if cc is PREFILL_CELLS[0] else covering(points[1::2], "chunk", "prep_threads"))
        for p, res in zip(pts, compile_clean(cc, pts)):
            row = compile_point(cc, p | {"prep_diag": "warp_row"})
            assert prep_ctas_per_sm(p, res["kda_chunk_prep"].regs) == prep_ctas_per_sm(
                p, dict(row.resources)["kda_chunk_prep"].regs), (cc.label(), p)


# ---- prep_exp = ex2 (G in base 2, one ex2.approx.ftz an exponential) and prep_addr = rowcol (launch 1's offsets) -----

GA_PREP = {"chunk": 32, "prep_threads": 128, "warps": 1, "kwarps": 2, "stages": 3, "prep_exp": "fast"} | MMA_DIAG


def test_ex2_rowcol_legality():
    """Both are offered on the mma prep only: each mma point again at ex2, and every one of those at rowcol; each is
    refused elsewhere by its own constraint."""
    c = PREFILL_CELLS[0]
    legal = all_legal(c, ksplit=True)
    mma = sorted(str(p) for p in legal
                 if p["prep_diag"] == "mma" and p["prep_exp"] != "ex2" and p["prep_addr"] == "swz")
    for exp, addr in (("ex2", "swz"), ("expf", "rowcol"), ("fast", "rowcol"), ("ex2", "rowcol")):
        on = [p for p in legal if p["prep_exp"] == exp and p["prep_addr"] == addr]
        base = [p for p in legal if p["prep_diag"] == "mma" and p["prep_addr"] == "swz"
                and p["prep_exp"] == ("fast" if exp == "ex2" else exp)]
        assert on and sorted(str(p | {"prep_exp": exp, "prep_addr": addr}) for p in base) == sorted(map(str, on))
    assert len([p for p in legal if p["prep_exp"] == "ex2" or p["prep_addr"] == "rowcol"]) == 2 * len(mma)
    p = TDEF.default_params() | {"stage_in": True, "prep_vec": True, "prep_round": "add", "prep_diag": "warp_row"}
    assert TDEF.violations(p | {"prep_exp": "ex2"}, ARCH, c.dtypes_dict(), c.dims_dict()) == ["ex2_on_the_mma_prep"]
    assert TDEF.violations(p | {"prep_addr": "rowcol"}, ARCH, c.dtypes_dict(), c.dims_dict()) == [
        "rowcol_on_the_mma_prep"]


def c_function(src: str, head: str) -> str:
    """The body of the first C function in src whose declaration starts with `head` (up to its closing brace)."""
    i = src.index(head)
    j = src.index("{", i)
    depth, k = 0, j
    while True:
        depth += {"{": 1, "}": -1}.get(src[k], 0)
        if depth == 0:
            return src[j + 1:k]
        k += 1


def c_int_expr(expr: str, **names: int) -> int:
    """A C integer expression of the helpers (non-negative operands: + * / >> << & ^ on ints and unsigned, casts,
    u suffixes, one conditional) evaluated in Python."""
    e = re.sub(r"\((?:unsigned|int)\)", "", expr)
    e = re.sub(r"(\d+)u\b", r"\1", e).replace("/", "//")
    e = re.sub(r"^(.*) \? (.*) : (.*)$", r"(\2) if (\1) else (\3)", e)  # one top-level conditional
    return eval(e, {"__builtins__": {}}, dict(names))  # noqa: S307 - the template's own text


def kg_loop(src: str) -> str:
    """launch 1's k exp(G_last - G) loop (prep_vec) with the comment of the rowcol one, to its closing brace."""
    i = src.index("\n", src.rindex("\n  }\n", 0, src.index("i < K * C / 8; i += PT) {")) + 1) + 1
    return src[i:src.index("\n  }\n", i) + 4]


def wu_items(src: str) -> str:
    """launch 1's w, u items: from their comment to the kernel's #undef."""
    i = src.index("  // w = Tinv X, u = Tinv (beta v) by tf32 mma: items")
    return src[i:src.index("#undef G_AT", i)]


def test_rowcol_offsets_are_the_swizzled_offsets_over_every_row_and_column():
    """prep_addr = rowcol changes how launch 1 computes its shared-memory offsets, not which bytes: rc<RB>(row, cb) and
    the rowcol stg<N>(t, c), read back from the rendered source and evaluated, equal swz<RB>(row RB + cb) and the swz
    build's stg<N>(t, c) for every row of a chunk and every byte (column) of a row of each tile launch 1 addresses:
    G [C][K] fp32, A [C][C] fp32, the staged q, k [C][K] and v [C][V] bf16, at chunk 32 and 64 (and the line-sized
    branch of rc at rows of 64 bytes); k exp(G_last - G)'s loop with its offsets hoisted gives each of its tokens those
    same offsets; and only the offsets change (and the 16-byte stores, indexed as uint4, and the w, u items with their
    kind chosen once, the same mma operands a kind): with them written back as swz's, the render is the swz build's."""
    for C in (32, 64):
        base = TDEF.default_params() | GA_PREP | {"chunk": C}
        old, new = (source(TDEF, PREFILL_CELLS[0], base | {"prep_addr": a}) for a in ("swz", "rowcol"))
        swz = c_function(old, "__device__ __forceinline__ int swz(int off)")
        L = re.search(r"constexpr int L = (.*?);", swz).group(1)
        swz_ret = re.search(r"return (.*?);", swz).group(1)
        rc = c_function(new, "__device__ __forceinline__ unsigned rc(unsigned row, unsigned cb)")
        rc_big, rc_small = re.findall(r"return (.*?);", rc)
        stg_head = "__device__ __forceinline__ int stg(int t, int c)"
        stg_old = re.search(r"return (.*?);", c_function(old, stg_head)).group(1)
        stg_new = re.search(r"return (.*?);", c_function(new, stg_head)).group(1)

        def swz_of(RB: int, off: int) -> int:
            return c_int_expr(swz_ret, off=off, L=c_int_expr(L.replace("ROW_BYTES", str(RB))))

        for RB in (4 * 128, 4 * C, 64):  # G, A; 64: rc's branch for rows shorter than a line (not used at K = 128)
            body = rc_big if RB >= 128 else rc_small
            for row in range(C):
                got = [c_int_expr(body.replace("ROW_BYTES", str(RB)), row=row, cb=cb) for cb in range(RB)]
                assert got == [swz_of(RB, row * RB + cb) for cb in range(RB)], (C, RB, row)
        for N in (128,):  # K = V = 128: the staged q, k and v tiles
            for t in range(C):
                assert [c_int_expr(stg_new.replace("N", str(N)), t=t, c=c) for c in range(N)] == \
                       [c_int_expr(stg_old.replace("N", str(N)), t=t, c=c) for c in range(N)], (C, N, t)
        prep_new = new.split("kda_chunk_recur(", 1)[0].split("kda_chunk_prep(", 1)[1]
        assert "rc<" not in old and "swz<K * 4>" not in prep_new
        back = re.sub(r"rc<K \* 4>\((\w+), \(([^()]*(?:\([^()]*\))?[^()]*)\) \* 4\)",
                      r"swz<K * 4>((\1 * K + \2) * 4)", new)
        back = back.replace("rc<K * 4>((t), (c) * 4)", "swz<K * 4>(((t) * K + (c)) * 4)")
        back = back.replace("rc<C * 4>((i), (j) * 4)", "swz<C * 4>(((i) * C + (j)) * 4)")
        back = back.replace(c_function(new, "__device__ __forceinline__ int stg(int t, int c)"),
                            c_function(old, "__device__ __forceinline__ int stg(int t, int c)"))
        i = back.index("\n// prep_addr = rowcol: swz<ROW_BYTES>")
        back = back[:i - 1] + back[back.index("\n}\n", i) + 2:]  # rc's comment and definition, and its blank line
        # k exp(G_last - G): the rowcol loop's hoisted offsets of token t + j (t a multiple of 8), evaluated for every
        # (channel, token group) a thread takes, are rc's and stg's; its store index (in uint4) is the swz build's
        # element offset / 8, exact (t and C multiples of 8): then the loop and the stores are put back as swz's
        kg_new = kg_loop(new)
        grow = re.search(r"grow = gs \+ (.*?);", kg_new).group(1)
        krow = re.search(r"krow = ks \+ (.*?);", kg_new).group(1)
        gc, kc = re.search(r"const unsigned gc = (.*?), kc = (.*?);", kg_new).groups()
        g_off = re.search(r"\(grow \+ (.*?)\);", kg_new).group(1)
        k_off = re.search(r"\(krow \+ (.*?)\)\);", kg_new).group(1)
        assert re.search(r"const unsigned c = i / \(C / 8\), t = 8 \* \(i % \(C / 8\)\);", kg_new)
        for i in range(128 * C // 8):
            c, t = i // (C // 8), 8 * (i % (C // 8))
            kw = {"c": c, "t": t, "K": 128, "C": C}
            g0, k0 = c_int_expr(grow, **kw), c_int_expr(krow, **kw)
            kw |= {"gc": c_int_expr(gc, **kw), "kc": c_int_expr(kc, **kw)}
            for j in range(8):
                assert g0 + c_int_expr(g_off, j=j, **kw) == swz_of(512, (t + j) * 512 + 4 * c), (C, c, t, j)
                assert k0 + c_int_expr(k_off, j=j, **kw) == c_int_expr(stg_old.replace("N", "128"), t=t + j, c=c)
        back = back.replace(kg_new, kg_loop(old))
        # w, u: the item's kind chosen once (each kind's k-steps apart), the same operands a kind: put back as swz's
        wu_new, wu_old = wu_items(new), wu_items(old)
        assert wu_new.count("if (kb > 2 * mt + 1) break;") == 2 and "if (is_w) {" in wu_old and "is_w" not in wu_new
        for op_old, op_new in (("tf32(G_AT(s0, col))",
                                "mma_tf32(acc[n], a, tf32(G_AT(s0, col)), tf32(G_AT(s1, col)));"),
                               ("tf32(be0 * v_at(s0, col))",
                                "mma_tf32(acc[n], a, tf32(be0 * v_at(s0, col)), tf32(be1 * v_at(s1, col)));")):
            assert op_old in wu_old and wu_new.count(op_new) == 1
        back = back.replace(wu_new, wu_old)
        for ws in ("ws_qg", "ws_kg"):
            back = re.sub(r"reinterpret_cast<uint4\*>\(" + ws + r"\)\[\((.*?)\) >> 3\] = (make_uint4\(.*?\));.*",
                          r"*reinterpret_cast<uint4*>(" + ws + r" + \1) = \2;", back)
        back = re.sub(r"\n    // \(indexed as uint4: .*\n    // .*\n", "\n", back)
        assert back == old


def test_ex2_renders_one_instruction_an_exponential_on_base2_decays():
    """prep_exp = ex2: launch 1's scan sums G in base 2 by fmaf against a base-2 bound, every exponential of launch 1 is
    the ex2 helper (one ex2.approx.ftz, no multiply) and none is expf or __expf; launch 2 is the fast build's."""
    c = PREFILL_CELLS[0]
    base = TDEF.default_params() | GA_PREP
    fast, ex2 = source(TDEF, c, base), source(TDEF, c, base | {"prep_exp": "ex2"})
    assert fast.split("kda_chunk_recur(", 1)[1] == ex2.split("kda_chunk_recur(", 1)[1]
    prep = ex2.split("kda_chunk_prep(", 1)[1].split("kda_chunk_recur(", 1)[0]
    assert "acc = fmaf(col[t], LOG2E, acc);" in prep and "constexpr float DIAG_RANGE = 60.f * LOG2E;" in prep
    assert "expf(" not in prep and prep.count("ex2(") == fast.split("kda_chunk_prep(", 1)[1].split(
        "kda_chunk_recur(", 1)[0].count("__expf(")
    helper = c_function(ex2, "__device__ __forceinline__ float ex2(float x)")
    assert 'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));' in helper and "*" not in helper
    assert float(f32(1.44269504088896341)) == float(LOG2E)  # the emulator's constant is the kernel's


def test_ex2_and_rowcol_build_spill_free_at_the_mma_occupancy():
    """ex2 / rowcol prep kernels of the mma prep (every chunk 32, 64 x 128, 256 threads and every pairing of ex2 and
    rowcol at least once in fla's default call; ex2 with rowcol at each chunk and threads in the model's varlen call
    with its variants) build for sm_90a without spills, stack or static smem, at no fewer CTAs an SM than the fast,
    swz build of the same point."""
    base = TDEF.default_params() | {"warps": 2, "stages": 3} | MMA_DIAG
    points = [base | {"chunk": ch, "prep_threads": pt, "prep_exp": ex, "prep_addr": ad}
              for ch in (32, 64) for pt in (128, 256)
              for ex, ad in (("ex2", "swz"), ("fast", "rowcol"), ("ex2", "rowcol"))]
    for cc in (PREFILL_CELLS[0], MODEL_VARLEN):
        both = [p for p in points if p["prep_exp"] == "ex2" and p["prep_addr"] == "rowcol"]
        pts = (covering(points, lambda p: (p["chunk"], p["prep_threads"]), lambda p: (p["prep_exp"], p["prep_addr"]))
               if cc is PREFILL_CELLS[0] else covering(both, "chunk", "prep_threads"))
        for p, res in zip(pts, compile_clean(cc, pts)):
            ref = compile_point(cc, p | {"prep_exp": "fast", "prep_addr": "swz"})
            assert prep_ctas_per_sm(p, res["kda_chunk_prep"].regs) >= prep_ctas_per_sm(
                p, dict(ref.resources)["kda_chunk_prep"].regs), (cc.label(), p)


# ---- kwarps: launch 2 with K split across the warps of a value group ----------------------------------------------

# legal points with kwarps 2 or 4 on PREFILL_CELLS[0]: 18 recurrences (kwarps 2 at chunk 32: warps 1, 2 at stages 3, 4,
# 6, warps 4 at stages 3, 4, warps 8 at stages 3; kwarps 4 likewise but warps 8; kwarps 4 at chunk 64: warps 1, stages
# 3; ksplit_2_spills_at_chunk_64 refuses kwarps 2 there) x 36 prep points each: at each prep_threads, the warp_row prep
# at 2 exponentials x 2 roundings x 3 loads (unstaged, staged, staged and vectorized: 12) and the mma prep (staged,
# vectorized, one add) at 3 exponentials x 2 offsets (6)
KSPLIT_POINTS = 18 * 2 * (2 * 2 * 3 + 3 * 2)
ONE_WARP_OPTIONS = ("state_split", "u_prefetch", "recur_lean", "recur_ldsm", "recur_fuse")


def ksplit_point(C: int = 32, warps: int = 1, kwarps: int = 4, stages: int = 3, **kw) -> dict:
    return TDEF.default_params() | {"chunk": C, "warps": warps, "kwarps": kwarps, "stages": stages} | kw


def ksplit_smem(p: dict, K: int = 128) -> int:
    """The kwarps kernel's layout: NS ring slots (-w, qg, kgT [C K bf16 each], A_qk [C C bf16], exp(G_last) [K fp32],
    u [C][16 W fp32]) and the partials [W][2][KW][C / 8][32] float4."""
    C, W, KW = p["chunk"], p["warps"], p["kwarps"]
    return p["stages"] * (3 * C * K * 2 + C * C * 2 + K * 4 + C * 16 * W * 4) + W * 2 * KW * (C // 8) * 32 * 16


def test_kwarps_legality():
    """kwarps 2, 4 give launch 2 a kernel of its own: legal exactly where the kwarps-1 twin with the one-warp-a-column
    options off is (or is refused only for that kernel's registers at chunk 64 or its 48 KB ring), when the plan's smem
    (the kernel's layout) fits the opt-in limit and the block 1024 threads; each of those options refuses it."""
    c = PREFILL_CELLS[0]
    dt, dims = c.dtypes_dict(), c.dims_dict()
    ks = [p for p in all_legal(c, ksplit=True) if p["kwarps"] > 1]
    assert len(ks) == KSPLIT_POINTS and len({recur_key(p) for p in ks}) == 18
    for p in ks:
        assert not any(p[k] for k in ONE_WARP_OPTIONS), p
        assert set(TDEF.violations(p | {"kwarps": 1}, ARCH, dt, dims)) <= {"one_warp_spills_at_chunk_64", "ring_fits_48KB"}
        launches, _ = TDEF.plan(p, ARCH, dt, dims)
        assert launches[1].smem == ksplit_smem(p) <= MAX_SMEM_PER_BLOCK, p
        assert launches[1].block == (32 * p["warps"] * p["kwarps"], 1, 1) and launches[1].grid[0] == 128 // (16 * p["warps"])
    twins = [p for p in all_legal(c) if not any(p[k] for k in ONE_WARP_OPTIONS)]
    got = {str(p) for p in ks}
    for p in twins:
        for kw in (2, 4):
            q = p | {"kwarps": kw}
            assert (str(q) in got) == (ksplit_smem(q) <= MAX_SMEM_PER_BLOCK and 32 * p["warps"] * kw <= 1024
                                       and (kw, p["chunk"]) != (2, 64)), q
    for opt in ONE_WARP_OPTIONS:  # (all_legal enumerates kwarps 2, 4 with these off: each refuses them)
        assert "ksplit_is_its_own_recurrence" in TDEF.violations(ksplit_point(**{opt: True}), ARCH, dt, dims), opt
    assert TDEF.violations(ksplit_point(C=64), ARCH, dt, dims) == []  # one warp at chunk 64: K / KW of the state a warp
    assert TDEF.default_params()["kwarps"] == 1


def test_the_kwarps_2_recurrences_at_chunk_64_spill_and_are_refused():
    """ksplit_2_spills_at_chunk_64 refuses exactly the kwarps-2 recurrences at chunk 64 (warps 1 and 2, stages 3: the
    others do not fit the opt-in limit), each of which builds at 255 registers with spills; kwarps 4 there does not."""
    c = PREFILL_CELLS[0]
    dt, dims = c.dtypes_dict(), c.dims_dict()
    refused = [ksplit_point(C=64, warps=w, kwarps=2) for w in (1, 2)]
    for p in refused:
        assert TDEF.violations(p, ARCH, dt, dims) == ["ksplit_2_spills_at_chunk_64"], p
    assert TDEF.violations(ksplit_point(C=64, warps=1, kwarps=2, stages=4), ARCH, dt, dims) != ["ksplit_2_spills_at_chunk_64"]
    for p in refused + [ksplit_point(C=64, warps=1, kwarps=4)]:
        r = compile_point(c, p)
        recur = dict(r.resources)["kda_chunk_recur"]
        assert (recur.spill_stores > 0) == (p["kwarps"] == 2), (p, recur)


def test_kwarps_points_compile_without_spills():
    """6 of the 18 kwarps recurrences (and their points' prep kernels) build for sm_90a without spills, stack or static smem,
    at most 255 registers; their rendering declares the plan's layout and trades partials at one named barrier a chunk
    (no scalar B-fragment loads: ldmatrix only)."""
    c = PREFILL_CELLS[2]
    by_key: dict = {}
    for p in all_legal(c, ksplit=True):
        if p["kwarps"] > 1 and p["prep_diag"] == "warp_row" and not p["stage_in"]:
            by_key.setdefault(recur_key(p), p)
    assert len(by_key) == 18
    # 6 of them (the ring depth changes only NS): every (chunk, warps, kwarps) at its deepest ring but warps 2 and 4 at
    # kwarps 2, all at stages 3 or their largest legal (the 20 of 2026-12-03 were recorded spill-free at 128-255 registers
    # when added; chunk 64's two kwarps-2 ones spill 76 B under NVRTC 13.5 and are refused since 2026-12-05)
    keep = {(32, 1, 6, 4), (32, 1, 6, 2), (32, 2, 6, 4), (32, 4, 4, 4), (32, 8, 3, 2), (64, 1, 3, 4)}
    points = [p for k, p in by_key.items() if (k[0], k[1], k[2], k[-1]) in keep]
    assert len(points) == len(keep)
    for p, res in zip(points, compile_clean(c, points)):
        assert res["kda_chunk_recur"].regs <= 255, (p, res)
    recur = recur_src(ksplit_point())
    assert "constexpr int SLOT = OFF_U + C * 16 * W * 4;" in recur and recur.count("bar.sync") == 1
    assert recur.count("__syncthreads()") == 1 and "word_k(" not in recur and "ldsm_x2(" in recur


def ksplit_loads(recur: str) -> list[tuple[str, str, str, str]]:
    """Each ldmatrix of the kwarps kernel as rendered: (x4 or x2, tile: ss, ss + OFF_Q, ..., lane offset, group offset d)."""
    out = re.findall(r"ldsm_(x[24])\(ldsm_addr<[CK] \* 2>\((ss(?: \+ OFF_[QAK])?), (l[kc]), (.+?)\), \w+(?:\[n\])?\);",
                     recur)
    for *_, expr in out:
        assert set(expr) <= set("nkpbwCKW*+() 0123456789"), expr
    return out


@pytest.mark.parametrize("C", [32, 64])
@pytest.mark.parametrize("KW", [2, 4])
def test_kwarps_ldmatrix_gives_every_lane_its_b_fragment(C: int, KW: int):
    """Every ldmatrix of the kwarps kernel, for every warp kw of a group, k-step pair, token or K tile (odd token tiles
    of A_qk by ldmatrix.x2 included), gives every lane exactly the m16n8k16 B fragment words (k 2 tig.., n grp),
    (k 2 tig + 8.., n grp) of its slice, read from tiles written as issue() writes them (swz, the model of the
    rendering): -w and qg over the warp's K columns, kgT over its K rows, A_qk's lower-triangular token tiles."""
    K, KK = 128, 128 // KW
    src = source(TDEF, PREFILL_CELLS[0], ksplit_point(C=C, kwarps=KW))
    recur = src.split("kda_chunk_recur(", 1)[1]
    swz = swz_model(src)
    lanes = lane_offsets(recur, swz, C, K)
    loads = ksplit_loads(recur)
    assert [(x, t, ln) for x, t, ln, _ in loads] == [("x4", "ss", "lk"), ("x4", "ss + OFF_Q", "lk"),
                                                    ("x2", "ss + OFF_A", "lc"), ("x4", "ss + OFF_K", "lc")]
    d_of = {t: (x, ln, d) for x, t, ln, d in loads}
    tiles = {"ss": (C, K), "ss + OFF_Q": (C, K), "ss + OFF_A": (C, C), "ss + OFF_K": (K, C)}
    for kw in range(KW):
        for name, (rows, cols) in tiles.items():
            x, ln, expr = d_of[name]
            rb, lane_sw = lanes[ln]
            tile, word = ring_tile(rows, cols, swz)

            def frag(n: int, kb: int):  # the words lane t must hold for B tile n, k-step kb: b0, b1
                return [[int(tile[8 * n + (t >> 2), 16 * kb + 2 * (t & 3) + h * 8] |
                             tile[8 * n + (t >> 2), 16 * kb + 2 * (t & 3) + h * 8 + 1].astype(np.uint32) << 16)
                         for h in range(2)] for t in range(32)]

            def load(**v):
                d = eval(expr, {}, v | {"C": C, "K": K, "KK": KK, "kw": kw})  # noqa: S307 (checked characters)
                r = ldsm_x4([ldsm_addr(0, lane_sw[t], d, swz, rb) for t in range(32)], word)
                return r if x == "x4" else [row[:2] for row in r]  # x2: matrices 0, 1 (lanes 0 .. 15's addresses)

            if name in ("ss", "ss + OFF_Q"):  # B (k = K column, n = token): k-steps of the warp's K columns
                for n in range(C // 8):
                    for kp in range(KK // 32):
                        r = load(n=n, kp=kp)
                        for h in range(2):
                            want = frag(n, (KK * kw + 32 * kp) // 16 + h)
                            assert [row[2 * h:2 * h + 2] for row in r] == want, (name, kw, n, kp, h)
            elif name == "ss + OFF_A":  # B (k = token j, n = token i) of o's tile n, every n
                for n in range(C // 8):
                    for kb in range(C // 16):
                        if 16 * kb <= 8 * n + 7:
                            assert load(n=n, kb=kb) == frag(n, kb), (name, n, kb)
            else:  # kgT: B (k = token, n = K row) of the warp's K rows, tiles n, n + 1
                for n in range(0, KK // 8, 2):
                    for kb in range(C // 16):
                        r = load(n=n, kb=kb)
                        nt = (KK * kw) // 8 + n
                        assert [row[:2] for row in r] == frag(nt, kb) and [row[2:] for row in r] == frag(nt + 1, kb)


@pytest.mark.parametrize("stages", [3, 4, 6])
def test_kwarps_ring_reads_every_chunk_landed_and_refills_a_free_slot(stages: int):
    """The one-item ring simulated from the rendered wait count and refill offset, for 1..7 chunks: chunk c is waited
    for (every later commit group may still be in flight) and read from slot c % NS; the refill issued in chunk c's
    interval goes to a slot no warp reads in that interval (chunk c - 1's, all warps past the barrier)."""
    recur = recur_src(ksplit_point(stages=stages))
    loop = recur.split("for (int c = 0; c < NT; ++c) {", 1)[1]
    wait = re.search(r'cp\.async\.wait_group %0;" :: "n"\(NS - (\d)\)', loop)
    refill = re.search(r"issue\(c \+ NS - (\d)\);", loop)
    assert wait and refill and "for (int s = 0; s < NS - 1; ++s) issue(s);" in recur
    lag, back = int(wait.group(1)), int(refill.group(1))
    for NT in range(1, 8):
        groups = list(range(stages - 1))  # commit group g carries chunk groups[g]
        for c in range(NT):
            landed = set(groups[:len(groups) - (stages - lag)])  # wait_group NS - lag: that many may be pending
            assert c in landed, (stages, NT, c)
            nxt = c + stages - back
            assert nxt % stages != c % stages
            groups.append(nxt)
    assert (lag, back) == (2, 1)


# ---- overlap: launch 2 on a side stream beside launch 1 (docs/kda_prefill_overlap.md) ------------------------------
def overlap_point(c: Cell, warps: int) -> dict:
    """The GA's split-K recurrence shape with the recurrence beside the prep (kda_export_h200_3's prefill run at B = 1)."""
    return ksplit_point(warps=warps, kwarps=2, stage_in=True, prep_vec=True, prep_round="add", prep_exp="fast",
                        prep_diag="mma", prep_threads=128, overlap=True)


def overlap_rules(p: dict, c: Cell) -> bool:
    """What overlap asks beyond its twin in order: equal lengths, the split-K recurrence, its CTAs one an SM (132), at
    most 256 threads (rendered to hold at most half the registers), and one recurrence CTA with one prep CTA in an SM's
    shared memory."""
    plan, _ = TDEF.plan(p | {"overlap": False}, ARCH, c.dtypes_dict(), c.dims_dict())
    prep, recur = plan
    ctas = recur.grid[0] * recur.grid[1] * recur.grid[2]
    return (c.dim("N") == c.dim("B") and p["kwarps"] > 1 and ctas <= 132 and recur.threads <= 256
            and prep.smem + recur.smem <= MAX_SMEM_PER_BLOCK)


@pytest.mark.parametrize("c", PREFILL_CELLS, ids=lambda c: c.label())
def test_overlap_legality(c: Cell):
    """Overlap adds rules only: a point is legal with it exactly where its twin in order is and overlap_rules hold."""
    dt, dims = c.dtypes_dict(), c.dims_dict()
    # one twin per combination of the params overlap's constraints and the plan read (overlap_rules reads the plan)
    rules = tuple(n for n, e in TDEF.constraints if "overlap" in e.names)
    twins = one_per_case(all_legal(c, ksplit=True), rules)
    on = [p | {"overlap": True} for p in twins if overlap_rules(p, c)]
    assert all(TDEF.is_valid(p, ARCH, dt, dims) for p in on)
    off = [p | {"overlap": True} for p in twins if not overlap_rules(p, c)]
    assert len(rules) >= 5 and len(off) > 50 and not any(TDEF.is_valid(p, ARCH, dt, dims) for p in off)
    # B = 1 cells keep split-K points (warps 2 at H = 32: 4 tiles x 32 heads; warps 1 at H = 16: 8 x 16); at B = 4 and
    # 8 only the widest tile (warps 8) has 128 CTAs, and its split-K block (512 threads and more) is too wide
    assert (len(on) > 0) == (c.dim("B") == 1), (c.label(), len(on))


def test_overlap_is_refused_on_a_varlen_batch():
    p = overlap_point(VARLEN, warps=2)
    assert "overlap_equal_lengths" in TDEF.violations(p, ARCH, VARLEN.dtypes_dict(), VARLEN.dims_dict())


def test_overlap_plan_zeroes_the_flags_then_runs_the_recurrence_beside_a_chunk_major_prep():
    from evo.measure.evaluate import make_job
    from evo.measure.launches import _NoBuild

    c = PREFILL_CELLS[0]  # B1-T8192-H32
    p = overlap_point(c, warps=2)
    assert TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()), TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict())
    plan, ws = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
    nc = -(-c.dim("T") // 32)
    assert [(ln.kernel, ln.stream, ln.fork_after) for ln in plan] == [
        ("kda_chunk_flags", "main", ""), ("kda_chunk_prep", "main", ""), ("kda_chunk_recur", "side", "kda_chunk_flags")]
    flags, prep, recur = plan
    assert flags.grid[0] * flags.block[0] >= c.dim("B") * c.dim("HV") * nc
    assert prep.grid == (c.dim("HV"), c.dim("B"), nc) and recur.grid == (4, c.dim("HV"), 1)
    assert prep.args[-1] == recur.args[-1] == "ws_flag" and ws["ws_flag"] == 4 * c.dim("B") * c.dim("HV") * nc
    in_order, _ = TDEF.plan(p | {"overlap": False}, ARCH, c.dtypes_dict(), c.dims_dict())
    assert in_order[0].grid == (nc, c.dim("HV"), c.dim("B")) and in_order[1].smem == recur.smem
    job = make_job(SPEC, TDEF, Genome.make("kda", "chunk", TDEF.source_hash, p), _NoBuild(), c, ARCH, seed=1,
                   timing=None, baseline=False)
    assert [(lj.kernel, lj.stream, lj.fork_after) for lj in job.launches] == [
        (ln.kernel, ln.stream, ln.fork_after) for ln in plan]


def _c_expr(src: str, pattern: str) -> str:
    m = re.search(pattern, src)
    assert m, pattern
    return m.group(1).replace("(long long)", "").replace("/", "//")


def test_overlap_flag_indices_agree_between_the_prep_and_the_recurrence():
    """From the rendered code: the prep CTA (blockIdx = (hv, b, ci)) publishes the flag the recurrence of (b, hv)
    waits for before copying chunk ci, every flag of the zeroed range exactly once."""
    c = cell(BF, 2, 100, 3)  # B = 2, 4 chunks of 32 (the last partial), H = 3
    p = overlap_point(c, warps=2)
    src = source(TDEF, c, p)
    prep_src = src[src.index("kda_chunk_prep("):src.index("kda_chunk_recur(")]
    recur_src = src[src.index("kda_chunk_recur("):]
    assert "const int hv = blockIdx.x, b = blockIdx.y, ci = blockIdx.z;" in prep_src
    cidx = _c_expr(prep_src, r"const long long cidx = (.*);")
    cb = _c_expr(recur_src, r"cb = (.*);")
    assert "ws_flag + cidx" in prep_src and "wait_chunk(ws_flag, cb + c + NS - 1)" in recur_src
    B, HV, T, C = c.dim("B"), c.dim("HV"), c.dim("T"), 32
    published = {eval(cidx, {"b": b, "hv": hv, "ci": ci, "HV": HV, "T": T, "C": C})
                 for b in range(B) for hv in range(HV) for ci in range(-(-T // C))}
    awaited = {eval(cb, {"b": b, "hv": hv, "HV": HV, "T": T, "C": C}) + ch
               for b in range(B) for hv in range(HV) for ch in range(-(-T // C))}
    assert published == awaited == set(range(B * HV * (-(-T // C))))


def test_overlap_recurrence_reads_the_workspace_only_by_cp_async_cg():
    """Launch 2 reads chunks launch 1 is still writing: never through the non-coherent read-only path (no
    ld.global.nc, no __ldg, no C++ load of a workspace pointer), only by cp.async.cg after the flag's acquire."""
    c = PREFILL_CELLS[0]
    src = source(TDEF, c, overlap_point(c, warps=2))
    recur = src[src.index("kda_chunk_recur("):]
    recur = recur[recur.index("{"):]  # the body: the signature declares the pointers
    assert "cp.async.cg.shared.global" in recur and "ld.acquire.gpu.global.b32" in src
    assert "ld.global.nc" not in recur and "__ldg" not in recur
    assert not re.search(r"\bws_\w+\s*\[", recur), "a workspace indexed by a C++ load"
    assert not re.search(r"\*\s*\(?\s*ws_\w+", recur), "a workspace dereferenced by a C++ load"


def test_overlap_point_builds_without_spills_with_its_three_kernels():
    c = PREFILL_CELLS[0]
    r = compile_point(c, overlap_point(c, warps=2))
    assert r.status.ok, r.error + r.log
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0
    res = dict(r.resources)
    assert set(res) == {"kda_chunk_flags", "kda_chunk_prep", "kda_chunk_recur"}
    # one recurrence CTA (128 threads) and one prep CTA (128) fit an SM's registers together
    assert res["kda_chunk_recur"].regs * 128 + res["kda_chunk_prep"].regs * 128 <= 65536, res
    off = compile_point(c, overlap_point(c, warps=2) | {"overlap": False})
    assert {k for k, _ in off.resources} == {"kda_chunk_prep", "kda_chunk_recur"}


# ---- recur_addr = hoist: the K-split recurrence's shared addresses as bases plus immediates ----------------------------

@pytest.mark.parametrize("addr", ["hoist", "carry"])
def test_recur_addr_legality(addr: str):
    """hoist and carry are offered on the K-split recurrence: every legal kwarps 2, 4 point has a legal twin with either.
    At kwarps 1, hoist breaks exactly hoist_on_the_split_k_recurrence; carry is legal exactly on the lean,
    ldmatrix-fed recurrence without recur_fuse and otherwise breaks exactly carry_on_the_lean_ldsm_recurrence."""
    assert TDEF.values("recur_addr") == ("swz", "hoist", "carry")
    c = PREFILL_CELLS[0]
    dt, dims = c.dtypes_dict(), c.dims_dict()
    ks = [p for p in all_legal(c, ksplit=True) if p["kwarps"] > 1]
    assert ks and all(p["recur_addr"] == "swz" for p in ks)
    for p in ks:
        assert TDEF.violations(p | {"recur_addr": addr}, ARCH, dt, dims) == [], p
    one = [p for p in all_legal(c) if p["kwarps"] == 1]
    lean = [p for p in one if p["recur_lean"] and p["recur_ldsm"] and not p["recur_fuse"]]
    assert len(lean) > 50 and len(one) > len(lean) + 50
    for p in one[:50] + lean:
        ok = addr == "carry" and p["recur_lean"] and p["recur_ldsm"] and not p["recur_fuse"]
        want = [] if ok else ["hoist_on_the_split_k_recurrence" if addr == "hoist" else "carry_on_the_lean_ldsm_recurrence"]
        assert TDEF.violations(p | {"recur_addr": addr}, ARCH, dt, dims) == want, p
    if addr == "carry":
        fused = [p for p in one if p["recur_fuse"]]
        assert fused and all(TDEF.violations(p | {"recur_addr": addr}, ARCH, dt, dims)
                             == ["carry_on_the_lean_ldsm_recurrence"] for p in fused)


def _swz(off: int, row_bytes: int) -> int:  # swz<ROW_BYTES>, as the template's C (checked against it below)
    line = max(row_bytes, 128)
    return off ^ (((off // line) & 7) << 4)


def _ldsm_addr(slot: int, lane_sw: int, d: int, row_bytes: int) -> int:  # ldsm_addr<RB>, as the template's C
    sd = _swz(d, row_bytes)
    return slot + (lane_sw ^ (sd & 0x70)) + (sd & ~0x70)


@pytest.mark.parametrize("C, KW", [(32, 2), (32, 4), (64, 4)])
def test_recur_addr_hoist_addresses_are_the_same_bytes(C: int, KW: int):
    """Every shared address the hoisted recurrence forms (its ring copies' destinations, its ldmatrix rows) equals the
    swz build's for every thread, warp, piece and tile: both formulas as the rendered sources write them, evaluated
    with swz and ldsm_addr modelled in Python (their C bodies pinned here, so a change to them fails this test)."""
    K, W = 128, 1
    p = ksplit_point(C=C, warps=W, kwarps=KW) | {"prep_diag": "warp_row"}
    hoist, swz = recur_src(p | {"recur_addr": "hoist"}), recur_src(p)
    head = source(TDEF, PREFILL_CELLS[0], TDEF.default_params() | p | {"recur_addr": "hoist"})
    assert "return off ^ (((off / L) & 7) << 4);" in c_function(head, "__device__ __forceinline__ int swz(")
    assert "return slot + (lane_sw ^ (unsigned)(sd & 0x70)) + (unsigned)(sd & ~0x70);" in c_function(
        head, "__device__ __forceinline__ unsigned ldsm_addr(")
    for text in ("ldsm_x4(ss + lw_[kp] + (unsigned)(16 * n * K), bw[n]);",
                 "ldsm_x4(ss + OFF_Q + lw_[kp] + (unsigned)(16 * n * K), bq[n]);",
                 "ldsm_x2(ss + OFF_A + la_[kb] + (unsigned)(16 * C * KW * m), bb);",
                 "ldsm_x4(ss + OFF_K + lg_[kb] + (unsigned)(16 * n * C), bk);",
                 "lw_[kp] = ldsm_addr<K * 2>(0u, lk, (KK * kw + 32 * kp) * 2);",
                 "la_[kb] = ldsm_addr<C * 2>(0u, lc, (8 * kw * C + 16 * kb) * 2);",
                 "lg_[kb] = ldsm_addr<C * 2>(0u, lc, (KK * kw * C + 16 * kb) * 2);",
                 "const unsigned dk = d + ok_[j % PB] + (unsigned)(j / PB * PB * STEP);",
                 "cp(d + oc0 + (unsigned)(j * STEP), sk + j * STEP);",
                 "cp(d + oa0 + (unsigned)(j * STEP), sa + j * STEP);",
                 "for (int j = 0; j < PB; ++j) ok_[j] = (unsigned)swz<K * 2>(tid * 16 + j * STEP);",
                 "const unsigned oc_ = (unsigned)swz<C * 2>(tid * 16), oc0 = OFF_K + oc_, oa0 = OFF_A + oc_;"):
        assert text in hoist, text
    for text in ("ldsm_x4(ldsm_addr<K * 2>(ss, lk, (8 * n * K + KK * kw + 32 * kp) * 2), bw[n]);",
                 "ldsm_x2(ldsm_addr<C * 2>(ss + OFF_A, lc, (8 * n * C + 16 * kb) * 2), bb);",
                 "ldsm_x4(ldsm_addr<C * 2>(ss + OFF_K, lc, ((KK * kw + 8 * n) * C + 16 * kb) * 2), bk);",
                 "ok_[j] = (unsigned)swz<K * 2>(tid * 16 + j * STEP);",
                 "oc_[j] = (unsigned)(OFF_K + swz<C * 2>(tid * 16 + j * STEP));",
                 "for (int j = 0; j < NA; ++j) oa_[j] = (unsigned)(OFF_A + swz<C * 2>(tid * 16 + j * STEP));"):
        assert text in swz, text
    KK, NTH = K // KW, 32 * W * KW
    STEP = NTH * 16
    NB, NA = -(-C * K * 2 // STEP), -(-C * C * 2 // STEP)
    LB = max(K * 2, 128)
    PB = 1 if STEP % (8 * LB) == 0 else 8 * LB // STEP
    for ss in (0, 0x9a00):  # a slot's address (a multiple of 128 bytes)
        for tid in range(NTH):
            ok = [_swz(tid * 16 + j * STEP, K * 2) for j in range(PB)]
            oc0, oa0 = _swz(tid * 16, C * 2), _swz(tid * 16, C * 2)
            for j in range(NB):
                assert ss + ok[j % PB] + j // PB * PB * STEP == ss + _swz(tid * 16 + j * STEP, K * 2)
                assert ss + oc0 + j * STEP == ss + _swz(tid * 16 + j * STEP, C * 2)
            for j in range(NA):
                assert ss + oa0 + j * STEP == ss + _swz(tid * 16 + j * STEP, C * 2)
        for lane in range(32):
            li, lr = lane >> 3, lane & 7
            lk = _swz(lr * K * 2 + 16 * li, K * 2)
            lc = _swz((8 * (li >> 1) + lr) * C * 2 + 16 * (li & 1), C * 2)
            for kw in range(KW):
                for kp in range(KK // 32):
                    lw = _ldsm_addr(0, lk, (KK * kw + 32 * kp) * 2, K * 2)
                    for n in range(C // 8):
                        assert ss + lw + 16 * n * K == _ldsm_addr(ss, lk, (8 * n * K + KK * kw + 32 * kp) * 2, K * 2)
                for kb in range(C // 16):
                    la = _ldsm_addr(0, lc, (8 * kw * C + 16 * kb) * 2, C * 2)
                    lg = _ldsm_addr(0, lc, (KK * kw * C + 16 * kb) * 2, C * 2)
                    for m in range(C // 8 // KW):
                        n = kw + KW * m
                        assert ss + la + 16 * C * KW * m == _ldsm_addr(ss, lc, (8 * n * C + 16 * kb) * 2, C * 2)
                    for n in range(0, KK // 8, 2):
                        assert ss + lg + 16 * n * C == _ldsm_addr(ss, lc, ((KK * kw + 8 * n) * C + 16 * kb) * 2, C * 2)
    # the slot carried from chunk to chunk: chunk c's offset and the slot its refill of chunk c + NS - 1 goes to
    for NS in (3, 4, 6):
        SLOT, cur = 1 << 14, 0
        for c in range(40):
            assert cur == c % NS * SLOT
            assert ((NS - 1) * SLOT if cur == 0 else cur - SLOT) == (c + NS - 1) % NS * SLOT
            cur = 0 if cur == (NS - 1) * SLOT else cur + SLOT
    assert "cur = cur == (unsigned)((NS - 1) * SLOT) ? 0u : cur + SLOT;" in hoist
    assert "issue(c + NS - 1, ring_s + (cur == 0 ? (unsigned)((NS - 1) * SLOT) : cur - SLOT));" in hoist


def test_recur_addr_points_compile_with_the_loop_spill_free():
    """hoist and carry on the K-split recurrences of the prefill GA's space (chunk 32, warps 1, 2, stages 3, 6,
    kwarps 2, 4: hoist's spilling point and ones holding every warps, stages and (kwarps, recur_addr)) and on chunk
    64's kwarps 4, and carry on the GA's lean, ldmatrix-fed one-warp-a-column recurrences (ones holding warps 1, 2,
    stages 3, 6, u_prefetch on and off), build OK at <= 255 registers with no spill inside the chunk loop. NVRTC 13.5 spills one 8-byte value (the state's base, stored before the loop, reloaded for the final state)
    at hoist's warps 2, stages 6, kwarps 4, where ptxas holds 128 registers (NVRTC 13.0 does that at carry's kwarps 4
    points: 2026-12-05); the one-warp recurrences do not spill."""
    from evo.build.sass import disassemble, inner_loops

    c = PREFILL_CELLS[0]
    ksplit = [ksplit_point(C=32, warps=w, kwarps=kw, stages=ns, recur_addr=a)
              for w, ns, kw, a in product((1, 2), (3, 6), (2, 4), ("hoist", "carry"))]
    points = covering(ksplit, "warps", "stages", lambda p: (p["kwarps"], p["recur_addr"]),
                      start=(ksplit_point(C=32, warps=2, kwarps=4, stages=6, recur_addr="hoist"),))
    points += [ksplit_point(C=64, warps=1, kwarps=4, recur_addr="carry")]
    points += covering([TDEF.default_params() | {"chunk": 32, "warps": w, "stages": ns, "stage_in": True,
                                                 "u_prefetch": up, "recur_lean": True, "recur_ldsm": True,
                                                 "recur_addr": "carry"}
                        for w, ns, up in product((1, 2), (3, 6), (False, True))],  # the one-warp-a-column recurrence's
                       "warps", "stages", "u_prefetch")
    results = [compile_point(c, points[0])]
    with ThreadPoolExecutor(compile_threads()) as pool:
        results += pool.map(lambda p: compile_point(c, p), points[1:])
    spilled = []
    for p, r in zip(points, results):
        assert r.status.ok, (p, r.error)
        res = dict(r.resources)["kda_chunk_recur"]
        assert res.regs <= 255 and max(res.spill_stores, res.spill_loads, res.stack_bytes) <= 8, (p, res)
        ins = [str(x) for x in disassemble(r.cubin, "kda_chunk_recur")]
        lp = max(inner_loops(disassemble(r.cubin, "kda_chunk_recur")), key=lambda x: (x.count("HMMA"), x.size))
        local = [i for i, x in enumerate(ins) if re.search(r"\b(STL|LDL)\b", x)]
        assert len(local) == (2 if res.spill_stores else 0) and not any(lp.first <= i <= lp.last for i in local), p
        if res.spill_stores:
            spilled.append((p["warps"], p["stages"], p["kwarps"], p["recur_addr"]))
        assert p["kwarps"] > 1 or not res.spill_stores, p
    assert set(spilled) <= {(2, 6, 4, "hoist")}, spilled


@pytest.mark.parametrize("W, NS", [(1, 3), (1, 6), (2, 4), (2, 6), (4, 3), (8, 6)])
def test_recur_addr_carry_on_the_one_warp_recurrence_keeps_its_items_slots_and_bytes(W: int, NS: int):
    """recur_addr = carry on the lean, ldmatrix-fed one-warp-a-column recurrence: evaluated from the rendered calls in
    their order (the prologue's, then each chunk's four refills and four acquires), every item is waited for in slot
    (item % NS) SLOT, every refill of item it goes to slot (it % NS) SLOT with its kind it % 4 and its chunk it / 4's
    source bytes (each kind's pointer carried a chunk a call), and each piece's slot offset (one of P per-thread
    offsets plus an immediate) is swz of the flat offset, for every thread; the mma and ldmatrix lines are swz's."""
    C, K = 32, 128
    p = TDEF.default_params() | {"chunk": C, "warps": W, "stages": NS, "stage_in": True, "recur_lean": True,
                                 "recur_ldsm": True}
    carry, swz = recur_src(p | {"recur_addr": "carry"}), recur_src(p)
    assert TDEF.violations(p | {"recur_addr": "carry"}, ARCH, PREFILL_CELLS[0].dtypes_dict(),
                           PREFILL_CELLS[0].dims_dict()) == []
    for text in ("unsigned cur = 0, pv_s = (unsigned)((NS - 1) * SLOT);",
                 "auto nxt = [](unsigned s) -> unsigned { return s == (unsigned)((NS - 1) * SLOT) ? 0u : s + (unsigned)SLOT; };",
                 "const unsigned sl0 = cur, sl1 = nxt(sl0), sl2 = nxt(sl1), sl3 = nxt(sl2);",
                 "pv_s = sl3;\n    cur = nxt(sl3);",
                 "const unsigned dj = d + dk_[j % P] + (unsigned)(j / P * P * CSTEP);",
                 "for (int j = 0; j < PK; ++j) dk_[j] = (unsigned)swz<K * 2>(tid * 16 + j * CSTEP);",
                 "for (int j = 0; j < PC; ++j) dc_[j] = (unsigned)swz<C * 2>(tid * 16 + j * CSTEP);",
                 "const unsigned char* src_0 = reinterpret_cast<const unsigned char*>(ws_w + cb * C * K) + tid * 16;",
                 "const unsigned char* src_1 = reinterpret_cast<const unsigned char*>(ws_qg + cb * C * K) + tid * 16;",
                 "const unsigned char* src_2 = reinterpret_cast<const unsigned char*>(ws_aqk + cb * C * C) + tid * 16;",
                 "const unsigned char* src_3 = reinterpret_cast<const unsigned char*>(ws_kg + cb * K * C) + tid * 16;",
                 "const float* src_g = ws_gl + cb * K + 4 * tid;"):
        assert text in carry, text
    assert [ln for ln in swz.splitlines() if "mma_bf16" in ln or "ldsm_x4(" in ln] == \
        [ln for ln in carry.splitlines() if "mma_bf16" in ln or "ldsm_x4(" in ln]
    for kind, size in enumerate(("C * K * 2", "C * K * 2", "C * C * 2", "C * K * 2")):  # each kind's carried source
        body = carry.split(f"auto issue_k{kind} = [&](int it, unsigned d) {{", 1)[1].split("auto ", 1)[0]
        for text in (f"constexpr int bytes = {size};", f'"l"(src_{kind} + j * CSTEP)', f"src_{kind} += bytes;",
                     f"constexpr int P = {'PK' if kind < 2 else 'PC'};"):
            assert text in body, (kind, text)
        assert (kind == 2) == ("src_g += K;" in body and '"l"(src_g)' in body), kind
    # the calls as rendered: the prologue's refills (item, slot), then the loop's refills and acquires in order
    pro = [(int(k), int(i), int(sl)) for k, i, sl in re.findall(r"issue_k(\d)\((\d+), ring_s \+ (\d+) \* SLOT\);", carry)]
    loop = step_loop(carry)
    events = re.findall(r"issue_k(\d)\(4 \* c \+ (\d) \+ NS - 1, ring_s \+ (\w+)\)|acquire\((sl\d)\)|"
                        r"(\w+)_s = ring_s \+ (sl\d);", loop)
    assert len(pro) == NS - 1 and sum(bool(e[0]) for e in events) == 4 and sum(bool(e[3]) for e in events) == 4
    SLOT, NT, cb = 1 << 13, 7, 11
    ptr = {kind: cb for kind in range(4)}  # each kind's source, in chunks
    issued = []

    def refill(kind: int, it: int, slot: int) -> None:
        assert kind == it % 4 and slot == it % NS * SLOT, (kind, it, slot)
        if it < 4 * NT:
            assert ptr[kind] == cb + it // 4, (kind, it)
            ptr[kind] += 1
        issued.append(it)

    for kind, it, sl in pro:
        refill(kind, it, sl * SLOT)
    cur, pv = 0, (NS - 1) * SLOT
    nxt = lambda x: 0 if x == (NS - 1) * SLOT else x + SLOT  # noqa: E731
    for c in range(NT):
        sl = {"sl0": cur}
        for k in (1, 2, 3):
            sl[f"sl{k}"] = nxt(sl[f"sl{k - 1}"])
        slots = sl | {"pv_s": pv}
        for kind, k, var, acq, name, var2 in events:
            if kind:
                refill(int(kind), 4 * c + int(k) + NS - 1, slots[var])
            item = int((acq or var2)[2]) if (acq or var2) else None
            if item is not None:
                assert slots[acq or var2] == (4 * c + item) % NS * SLOT, (c, item)
        pv, cur = sl["sl3"], nxt(sl["sl3"])
    assert issued == list(range(4 * NT + NS - 1))
    CSTEP = 32 * W * 16
    for rb in (K * 2, C * 2):
        line = max(rb, 128)
        P = 1 if CSTEP % (8 * line) == 0 else 8 * line // CSTEP
        for tid in range(32 * W):
            off = [_swz(tid * 16 + j * CSTEP, rb) for j in range(P)]
            for j in range(-(-C * K * 2 // CSTEP)):
                assert off[j % P] + j // P * P * CSTEP == _swz(tid * 16 + j * CSTEP, rb), (rb, tid, j)


CARRY_LINES = (  # recur_addr = carry's own formulas, as rendered (test_recur_addr_carry_is_hoist_with_carried_addresses)
    "const unsigned char* sw = reinterpret_cast<const unsigned char*>(ws_w + cb * C * K) + tid * 16;",
    "const unsigned char* sq = reinterpret_cast<const unsigned char*>(ws_qg + cb * C * K) + tid * 16;",
    "const unsigned char* sk = reinterpret_cast<const unsigned char*>(ws_kg + cb * K * C) + tid * 16;",
    "const unsigned char* sa = reinterpret_cast<const unsigned char*>(ws_aqk + cb * C * C) + tid * 16;",
    "const float* sg = ws_gl + cb * K + 4 * tid;",
    "const float* su = ws_u + cb * C * V + su_[0];",
    "if (tid < K / 4) cp(d + OFF_G + 16 * tid, sg);",
    "cp(d + ou_[0] + (unsigned)(j * NTH * 16), su + j * (NTH / (4 * W)) * V);",
    "sw += C * K * 2;", "sq += C * K * 2;", "sk += K * C * 2;", "sa += C * C * 2;", "sg += K;", "su += C * V;",
    "uo_[h][0] = (unsigned)(OFF_U + swz<64 * W>((t * 16 * W + vl) * 4));",
    "uo_[h][1] = (unsigned)(OFF_U + swz<64 * W>(((t + 1) * 16 * W + vl) * 4));",
    "uo_[h][2] = (unsigned)(OFF_U + swz<64 * W>((t * 16 * W + vl + 8) * 4));",
    "uo_[h][3] = (unsigned)(OFF_U + swz<64 * W>(((t + 1) * 16 * W + vl + 8) * 4));",
    "vn[n][e] = *reinterpret_cast<const float*>(sl + uo_[n & 1][e] + (unsigned)(n / 2 * 16 * 64 * W));",
    "const float4 p = xv[(j * (C / 8) + n) * 32 + lane];",
    "const unsigned kwu = (unsigned)threadIdx.x / 32u % (unsigned)KW;",
    "if (16 * kb <= 8 * KW * m + 7 || 16 * kb <= 8 * (kwu + KW * m) + 7) {",
    "int ot = 8 * kw + 2 * tig + odd;",
    "bf16* ob = orow + (long long)ot * HV * V + vr - odd;",
    "const long long om = (long long)8 * KW * HV * V, oc = (long long)C * HV * V;",
    "if (ot + 8 * KW * m < len) {",
    "unsigned* op = reinterpret_cast<unsigned*>(ob + m * om);",
    "ot += C;", "ob += oc;",
)


@pytest.mark.parametrize("C, W, KW", [(32, 1, 2), (32, 1, 4), (32, 2, 2), (32, 2, 4), (64, 1, 4)])
def test_recur_addr_carry_is_hoist_with_carried_addresses(C: int, W: int, KW: int):
    """recur_addr = carry is hoist's kernel but for the addresses it carries, each the same as hoist's (and swz's) for
    every thread, lane, warp, piece, tile and chunk, its formulas as rendered (CARRY_LINES) evaluated in Python: the
    refill's sources (one pointer a stream, advanced a chunk a call; u's pieces one pointer and one slot offset apart
    by constants), u's words (8 offsets a lane, tiles n + 2 an immediate further), o's address and bound (carried a
    chunk), the A_qk blocks it multiplies, and the partials read back for v_new (its own too, the same bits)."""
    K, V, HV = 128, 128, 32
    p = ksplit_point(C=C, warps=W, kwarps=KW) | {"prep_diag": "warp_row"}
    carry, hoist = recur_src(p | {"recur_addr": "carry"}), recur_src(p | {"recur_addr": "hoist"})
    for text in CARRY_LINES:
        assert text in carry and text not in hoist, text
    assert "j == kw ? make_float4(pv[n][0]" in hoist and "j == kw ?" not in carry
    # the same ldmatrix rows, ring copies' destinations, slot carry and mma sequence as hoist's: only these differ
    assert [ln for ln in hoist.splitlines() if "ldsm_x" in ln or "mma_bf16" in ln] == \
        [ln for ln in carry.splitlines() if "ldsm_x" in ln or "mma_bf16" in ln]
    NTH = 32 * W * KW
    NU = -(-C * 4 * W // NTH)
    SLOT_U = 0x9000  # OFF_U's value does not matter: both sides add it
    for tid in range(NTH):
        for j in range(NU):  # u's pieces: ou_[j], su_[j] as the rendered loop computes them
            i = tid + j * NTH
            assert SLOT_U + _swz(tid * 16, 64 * W) + j * NTH * 16 == SLOT_U + _swz(i * 16, 64 * W)
            su0 = (tid // (4 * W)) * V + 4 * (tid % (4 * W))
            assert su0 + j * (NTH // (4 * W)) * V == (i // (4 * W)) * V + 4 * (i % (4 * W))
    # the carried sources advance by the stride at which hoist's render finds chunk ch's tile (ws + ch * stride), in
    # bytes for the bf16 tiles (byte pointers) and in floats for exp(G_last) and u (float pointers); each starts at
    # chunk cb (CARRY_LINES), and a call advances it only when it copies (c < NT), so call c reads chunk cb + c
    env = {"C": C, "K": K, "V": V}
    hoisted = dict(re.findall(r"reinterpret_cast<const unsigned char\*>\((ws_\w+) \+ ch \* ([CK] \* [CK])\)", hoist))
    hoisted |= {"ws_gl": re.search(r"ws_gl \+ ch \* (K) \+ 4 \* tid", hoist).group(1),
                "ws_u": re.search(r"ws_u \+ ch \* (C \* V);", hoist).group(1)}
    carried = dict(re.findall(r"\b(s[wqkagu]) \+= ([^;]+);", carry))
    for ptr, ws, size in (("sw", "ws_w", 2), ("sq", "ws_qg", 2), ("sk", "ws_kg", 2), ("sa", "ws_aqk", 2),
                          ("sg", "ws_gl", 1), ("su", "ws_u", 1)):
        assert eval(carried[ptr], {}, env) == size * eval(hoisted[ws], {}, env), (ptr, carried[ptr], hoisted[ws])
    guarded = carry.split("if (c < NT) {", 1)[1].split('asm volatile("cp.async.commit_group;"', 1)[0]
    assert all(f"{ptr} += " in guarded for ptr in carried), carried
    for lane in range(32):
        grp, tig = lane >> 2, lane & 3
        odd = grp & 1
        for vg in range(W):
            vl = 16 * vg + grp
            for n in range(C // 8):  # u's words of v_new
                t = 8 * n + 2 * tig
                h, t0 = n & 1, 8 * (n & 1) + 2 * tig
                want = [(t * 16 * W + vl) * 4, ((t + 1) * 16 * W + vl) * 4, (t * 16 * W + vl + 8) * 4,
                        ((t + 1) * 16 * W + vl + 8) * 4]
                got = [(t0 * 16 * W + vl) * 4, ((t0 + 1) * 16 * W + vl) * 4, (t0 * 16 * W + vl + 8) * 4,
                       ((t0 + 1) * 16 * W + vl + 8) * 4]
                for e in range(4):
                    assert _swz(got[e], 64 * W) + n // 2 * 16 * 64 * W == _swz(want[e], 64 * W), (lane, n, e, h)
            for kw in range(KW):
                vr = vl  # v0 = 0: both sides add the tile's first column
                for ln in (1000, 4 * C + 3, 4 * C):  # o's rows: a sequence's length, full and partial last chunks
                    ot, ob = 8 * kw + 2 * tig + odd, (8 * kw + 2 * tig + odd) * HV * V + vr - odd
                    for c in range(-(-ln // C)):
                        for m in range(C // 8 // KW):
                            n = kw + KW * m
                            t = c * C + 8 * n + 2 * tig + odd
                            assert (ot + 8 * KW * m < ln) == (t < ln)
                            assert ob + m * 8 * KW * HV * V == t * HV * V + vr - odd
                        ot, ob = ot + C, ob + C * HV * V
                for m in range(C // 8 // KW):  # A_qk's blocks kb of token tile n: the same lower-triangular set
                    n = kw + KW * m
                    for kb in range(C // 16):
                        assert (16 * kb <= 8 * KW * m + 7 or 16 * kb <= 8 * (kw + KW * m) + 7) == (16 * kb <= 8 * n + 7)


# ---- prep_wu = bf16: w, u by bf16 mma on ldmatrix fragments ----------------------------------------------------------

WU_BASE = TDEF.default_params() | MMA_DIAG | {"chunk": 32, "prep_threads": 128, "prep_exp": "ex2", "prep_addr": "rowcol",
                                              "warps": 2, "stages": 3}


def test_prep_wu_legality():
    """bf16 is offered on the rowcol prep: every such tf32 point of the space has a legal bf16 twin, and every other
    legal point's twin breaks exactly bf16_wu_on_the_rowcol_prep."""
    assert TDEF.values("prep_wu") == ("tf32", "bf16")
    c = PREFILL_CELLS[0]
    legal = all_legal(c, ksplit=True)
    ok = [p for p in legal if p["prep_addr"] == "rowcol"]
    assert len(ok) > 100
    rest = [p for p in legal if p not in ok]
    for p in ok + random.Random(5).sample(rest, 300):
        want = [] if p in ok else ["bf16_wu_on_the_rowcol_prep"]
        assert TDEF.violations(p | {"prep_wu": "bf16"}, ARCH, c.dtypes_dict(), c.dims_dict()) == want, p


def wu_model(src: str) -> dict:
    """The bf16 w, u section's index expressions, read from the rendered CUDA (casts dropped; C's * + >> & mean the
    same in Python): Tinv diag(beta)'s store offset, its row pitch, the A and B fragments' lane addresses."""
    def grab(pattern: str) -> str:
        m = re.search(pattern, src)
        assert m, pattern
        return m.group(1).replace("(unsigned)", "").replace("(int)", "")
    store = grab(r"\*reinterpret_cast<bf16\*>\(gs \+ ([^)]+)\) = hi;")
    store_lo = grab(r"\*reinterpret_cast<bf16\*>\(gs \+ (.+?)\) = __float2bfloat16_rn\(x - __bfloat162float\(hi\)\);")
    pitch = grab(r"constexpr unsigned AB = ([^;]+);")
    lanes = re.search(r"const unsigned ar = ([^,]+), ac = ([^;]+);", src)
    a_addr = grab(r"ldsm_x4\(ab_s \+ ([^;]+), a\);")
    a_lo = grab(r"ldsm_x4\(ab_s \+ ([^;]+), al\);")
    b_args = grab(r"ldsm_x4_t\(src \+ \(unsigned\)stg<K>\((.+)\), b\);")
    depth, cut = 0, None
    for i, ch in enumerate(b_args):  # the top-level comma between stg's row and column
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            cut = i
    assert lanes and cut is not None
    mmas = ("mma_bf16(acc[2 * n2], a, b[0], b[1]);\n          mma_bf16(acc[2 * n2], al, b[0], b[1]);\n"
            "          mma_bf16(acc[2 * n2 + 1], a, b[2], b[3]);\n          mma_bf16(acc[2 * n2 + 1], al, b[2], b[3]);")
    for line in ("for (int kb = 0; kb < C / 16; ++kb) {", "if (kb > mt) break;", mmas, "for (int n2 = 0; n2 < 4; ++n2) {",
                 "const float x = tc[i] * bj;", "const bf16 hi = __float2bfloat16_rn(x);",
                 "const unsigned src = (unsigned)__cvta_generic_to_shared(ng < 2 ? ks : vs);"):
        assert line in src, line
    return {"store": store, "store_lo": store_lo, "a_lo": a_lo, "pitch": pitch, "ar": lanes.group(1).replace("(unsigned)", ""),
            "ac": lanes.group(2).replace("(unsigned)", ""), "a": a_addr, "b_row": b_args[:cut], "b_col": b_args[cut + 1:]}


def ldsm(rows: list[int], lane: int, trans: bool) -> list[list[int]]:
    """ldmatrix.x4's registers of `lane` as the byte addresses of their two bf16 halves (low, high), from the 32 lanes'
    row addresses (lanes 8 i .. 8 i + 7: matrix i's rows): non-trans row lane / 4, elements 2 (lane % 4) and the next;
    trans column lane / 4 of rows 2 (lane % 4) and the next."""
    g, t = lane // 4, lane % 4
    if trans:
        return [[rows[8 * i + 2 * t] + 2 * g, rows[8 * i + 2 * t + 1] + 2 * g] for i in range(4)]
    return [[rows[8 * i + g] + 4 * t, rows[8 * i + g] + 4 * t + 2] for i in range(4)]


@pytest.mark.parametrize("C", [32, 64])
def test_prep_wu_bf16_fragments_are_the_mma_operands(C: int):
    """Evaluated from the rendered code: Tinv diag(beta)'s store covers its tile once within G's region; every lane's
    ldmatrix A fragment of every (row tile, k16-step) holds Tinv diag(beta)'s elements (g, 2t..), (g + 8, 2t..),
    (g, 2t + 8..), (g + 8, 2t + 8..), and every ldmatrix.trans B fragment of every column pair the staged tile's
    (k 2t.., n g) and (k 2t + 8.., n g) of its two n-tiles; the k16-steps stop at the tile's diagonal (Tinv is lower
    triangular); each 8-lane phase of every load reads 8 distinct 16-byte bank groups (no conflict)."""
    p = WU_BASE | {"chunk": C, "prep_wu": "bf16"}
    c = PREFILL_CELLS[0]
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    src = source(TDEF, c, p)
    # rowcol's stg is swz's byte for byte (test_rowcol_offsets_are_the_swizzled_offsets_over_every_row_and_column)
    m, stg = wu_model(src), stg_offset(source(TDEF, c, p | {"prep_addr": "swz", "prep_wu": "tf32"}))
    K = 128
    AB = eval(m["pitch"], {}, {"C": C})  # noqa: S307 (read from our own render)
    amap = {}  # byte -> (tile, row, column): tile 0 hi, 1 lo
    for part, i, tid in product((0, 1), range(C), range(C)):
        a = eval(m["store_lo" if part else "store"], {}, {"i": i, "tid": tid, "AB": AB, "C": C})  # noqa: S307
        assert a % 2 == 0 and a + 2 <= C * K * 4 and a not in amap
        amap[a] = (part, i, tid)
    bmap = {stg(t, col, K): (t, col) for t in range(C) for col in range(K)}
    for mt in range(C // 16):
        for kb in range(mt + 1):  # k16-steps past kb = mt meet only Tinv's zeros above the diagonal
            env = [{"lane": ln, "mt": mt, "kb": kb, "AB": AB} for ln in range(32)]
            for e in env:
                e["ar"], e["ac"] = (eval(m[k], {}, e) for k in ("ar", "ac"))  # noqa: S307
            for part in (0, 1):
                rows = [eval(m["a_lo" if part else "a"], {}, e | {"C": C}) for e in env]  # noqa: S307
                for ph in range(4):
                    assert len({r // 16 % 8 for r in rows[8 * ph: 8 * ph + 8]}) == 8
                for ln in range(32):
                    g, t = ln // 4, ln % 4
                    got = [[amap[x] for x in reg] for reg in ldsm(rows, ln, trans=False)]
                    r0, k0 = 16 * mt + g, 16 * kb + 2 * t
                    assert got == [[(part, r0, k0), (part, r0, k0 + 1)], [(part, r0 + 8, k0), (part, r0 + 8, k0 + 1)],
                                   [(part, r0, k0 + 8), (part, r0, k0 + 9)],
                                   [(part, r0 + 8, k0 + 8), (part, r0 + 8, k0 + 9)]]
            for col0, n2 in product((0, 64), range(4)):
                brow = [stg(eval(m["b_row"], {}, e), eval(m["b_col"], {}, e | {"col0": col0, "n2": n2}), K)  # noqa: S307
                        for e in env]
                for ph in range(4):
                    assert len({r // 16 % 8 for r in brow[8 * ph: 8 * ph + 8]}) == 8
                for ln in range(32):
                    g, t = ln // 4, ln % 4
                    got = [[bmap[x] for x in reg] for reg in ldsm(brow, ln, trans=True)]
                    k0, n0 = 16 * kb + 2 * t, col0 + 16 * n2 + g
                    assert got == [[(k0, n0), (k0 + 1, n0)], [(k0 + 8, n0), (k0 + 9, n0)],
                                   [(k0, n0 + 8), (k0 + 1, n0 + 8)], [(k0 + 8, n0 + 8), (k0 + 9, n0 + 8)]]


def test_prep_wu_bf16_fragment_check_catches_a_wrong_lane_map():
    """The fragment test's model fails on a mutated render: the A rows' half-tile bit taken from lane bit 4."""
    p = WU_BASE | {"prep_wu": "bf16"}
    src = source(TDEF, PREFILL_CELLS[0], p)
    good = "const unsigned ar = (unsigned)((lane & 7) + 8 * ((lane >> 3) & 1)), ac = (unsigned)(16 * (lane >> 4));"
    assert good in src
    bad = src.replace(good, "const unsigned ar = (unsigned)((lane & 7) + 8 * ((lane >> 4) & 1)), ac = (unsigned)(16 * ((lane >> 3) & 1));")
    m = wu_model(bad)
    AB = eval(m["pitch"], {}, {"C": 32})  # noqa: S307
    amap = {eval(m["store"], {}, {"i": i, "tid": j, "AB": AB}): (i, j) for i in range(32) for j in range(32)}  # noqa: S307
    env = [{"lane": ln, "mt": 0, "kb": 0, "AB": AB} for ln in range(32)]
    for e in env:
        e["ar"], e["ac"] = (eval(m[k], {}, e) for k in ("ar", "ac"))  # noqa: S307
    rows = [eval(m["a"], {}, e) for e in env]  # noqa: S307
    got = [[amap[x] for x in reg] for reg in ldsm(rows, 5, trans=False)]
    assert got[1] != [(9, 2), (9, 3)]  # lane 5 (g 1, t 1): a[1] should be (g + 8, 2t..)


def test_prep_wu_bf16_builds_spill_free_with_half_the_mma():
    """The bf16 w, u prep (chunk 32 at 128 and 256 threads, chunk 64 at 128 in fla's default call; chunk 32 at 256 and
    chunk 64 at 128 in the model's varlen call with its variants) builds for sm_90a without spills, stack or static smem, at no fewer CTAs an SM than its
    tf32 twin; the w, u items' 192 m16n8k8 tf32 products become 96 m16n8k16 ones over hi and lo (as many HMMA: 40 in the
    static SASS against 72, the A_kk, A_qk products' 8 tf32 ones in both and the tf32 items' k-loop unrolled for both
    kinds), their B operands by ldmatrix.trans."""
    from evo.build.sass import disassemble

    points = [WU_BASE | {"prep_wu": "bf16", "chunk": ch, "prep_threads": pt} for ch, pt in ((32, 128), (32, 256), (64, 128))]
    for cc in (PREFILL_CELLS[0], MODEL_VARLEN):
        pts = points if cc is PREFILL_CELLS[0] else points[1:]
        for p, res in zip(pts, compile_clean(cc, pts)):
            ref = compile_point(cc, p | {"prep_wu": "tf32"})
            assert prep_ctas_per_sm(p, res["kda_chunk_prep"].regs) >= prep_ctas_per_sm(
                p, dict(ref.resources)["kda_chunk_prep"].regs), (cc.label(), p)
    r, ref = (compile_point(PREFILL_CELLS[0], points[0] | {"prep_wu": wu}) for wu in ("bf16", "tf32"))
    hmma = [sum("HMMA" in x for x in disassemble(b.cubin, "kda_chunk_prep")) for b in (r, ref)]
    ldsm_n = sum("LDSM" in x for x in disassemble(r.cubin, "kda_chunk_prep"))
    assert hmma == [40, 72] and ldsm_n >= 6


# ---- recur_early: the K-split recurrence's slot loads first, its refill without a branch ------------------------------

CARRY_SEEDS = Path(__file__).resolve().parents[2] / "experiments" / "seeds" / "kda_prefill_carry.json"


def test_recur_early_legality():
    """mid and late are offered on the K-split recurrence with carry: every legal kwarps 2, 4 point with carry takes
    either; with swz or hoist, or at kwarps 1 (the lean carry recurrence included), they break exactly
    early_on_the_carry_split_k_recurrence."""
    assert TDEF.values("recur_early") == ("none", "mid", "late")
    c = PREFILL_CELLS[0]
    dt, dims = c.dtypes_dict(), c.dims_dict()
    ks = [p for p in all_legal(c, ksplit=True) if p["kwarps"] > 1]
    one = [p for p in all_legal(c) if p["kwarps"] == 1]
    lean = [p | {"recur_addr": "carry"} for p in one if p["recur_lean"] and p["recur_ldsm"] and not p["recur_fuse"]]
    assert len(ks) == KSPLIT_POINTS and lean and all(p["recur_early"] == "none" for p in ks + one)
    assert all(TDEF.violations(p, ARCH, dt, dims) == [] for p in lean)
    for v in ("mid", "late"):
        for p in ks:
            assert TDEF.violations(p | {"recur_addr": "carry", "recur_early": v}, ARCH, dt, dims) == [], p
        for p in ks[::50] + [p | {"recur_addr": "hoist"} for p in ks[::50]] + one[:50] + lean:
            assert TDEF.violations(p | {"recur_early": v}, ARCH, dt, dims) == ["early_on_the_carry_split_k_recurrence"], p


def _recur_chunk_loop(build) -> list[str]:
    """The recurrence's chunk loop in SASS (the innermost loop with the most HMMA), instructions only."""
    from evo.build.sass import disassemble, inner_loops

    lines = disassemble(build.cubin, "kda_chunk_recur")
    lp = max(inner_loops(lines), key=lambda x: (x.count("HMMA"), x.size))
    return [x for x in lines[lp.first:lp.last + 1] if not x.endswith(":")]


@pytest.mark.parametrize("early", ["mid", "late"])
def test_recur_early_moves_the_slot_loads_and_drops_the_refill_branch(early: str):
    """On the carry seeds' K-split entries (B1-T8192: kwarps 2; B1-T32768: kwarps 4), recur_early builds spill-free
    and its chunk loop keeps the mma and the refill's copies (as many HMMA and LDGSTS) but loses the refill's branch;
    after the group's barrier it loads C / 8 x 4 fewer words of u and K / KW / 8 fewer pairs of exp(G_last) (read
    before it); mid issues every copy before that barrier, late after o's stores."""
    seeds = json.loads(CARRY_SEEDS.read_text())["dispatch"]
    cells = {c.label(): c for c in PREFILL_CELLS}
    entries = [(cells[k], TDEF.complete(e["params"])) for k, e in seeds.items() if e["params"]["kwarps"] > 1]
    assert sorted(p["kwarps"] for _, p in entries) == [2, 4]
    for c, p in entries:
        loops = {}
        for v, r in zip(("none", early), compile_clean(c, [p | {"recur_early": "none"}, p | {"recur_early": early}])):
            assert r["kda_chunk_recur"].stack_bytes == 0
            loops[v] = _recur_chunk_loop(compile_point(c, p | {"recur_early": v}))
        count = {v: {op: sum(op in x.split()[0] or (x.startswith("@") and op in x.split()[1]) for x in lp)
                     for op in ("HMMA", "LDGSTS", "BRA")} for v, lp in loops.items()}
        assert count[early]["HMMA"] == count["none"]["HMMA"] > 0, count
        assert count[early]["LDGSTS"] == count["none"]["LDGSTS"] > 0, count
        assert count[early]["BRA"] == count["none"]["BRA"] - 1, count

        def after_group_barrier(lp: list[str]) -> list[str]:
            bars = [i for i, x in enumerate(lp) if x.startswith("BAR.SYNC")]
            assert len(bars) == 2, bars  # the chunk's barrier, then the group's (named, by register)
            return lp[bars[1]:]

        lds = {v: sum(x.startswith("LDS") and not x.startswith("LDSM") for x in after_group_barrier(lp))
               for v, lp in loops.items()}
        assert lds["none"] - lds[early] == 32 // 8 * 4 + 128 // p["kwarps"] // 8, lds
        lp = loops[early]
        copies = [i for i, x in enumerate(lp) if "LDGSTS" in x]
        if early == "mid":
            assert max(copies) < [i for i, x in enumerate(lp) if x.startswith("BAR.SYNC")][1]
        else:
            # after o's stores, among the state update's mma (no branch: ptxas interleaves them)
            assert min(copies) > max(i for i, x in enumerate(lp) if "STG" in x)


# ---- prep_v = late: v staged over q after the A phase (6 prep CTAs an SM) ---------------------------

VLATE_BASE = {"chunk": 32, "prep_diag": "mma", "prep_exp": "ex2", "prep_addr": "rowcol", "prep_round": "add",
              "prep_vec": True, "stage_in": True, "prep_threads": 128, "prep_wu": "bf16"}


def test_prep_v_legality():
    """late is offered on the staged bf16 w, u prep at 128 threads (every such point takes it), and elsewhere breaks
    exactly late_v_on_the_bf16_wu_prep_at_128_threads."""
    assert TDEF.values("prep_v") == ("early", "late")
    c = PREFILL_CELLS[0]
    legal = all_legal(c, ksplit=True)
    bf16 = [p | {"prep_wu": "bf16"} for p in legal if p["prep_addr"] == "rowcol"]
    ok = [p for p in bf16 if p["stage_in"] and p["prep_threads"] == 128]
    rest = [p for p in legal + bf16 if p not in ok]
    assert_offered_exactly(c, {"prep_v": "late"}, ok, rest, "late_v_on_the_bf16_wu_prep_at_128_threads")


def assert_offered_exactly(c: Cell, over: dict, ok: list[dict], rest: list[dict], constraint: str) -> None:
    """`over` is legal on every point of ok and breaks exactly `constraint` on every fifth of rest (both sizable)."""
    dt, dims = c.dtypes_dict(), c.dims_dict()
    assert len(ok) > 100 and len(rest) > 1000
    assert all(TDEF.violations(p | over, ARCH, dt, dims) == [] for p in ok)
    assert all(TDEF.violations(p | over, ARCH, dt, dims) == [constraint] for p in rest[::5])


def test_prep_v_late_copies_v_over_q_after_its_last_read_and_waits_before_the_items():
    """In the rendered prep (fla's default call and the model's varlen call with its variants): q's staged tile is
    last read before a CTA barrier, after which v's copies into it are issued; each thread waits for its copies before
    the barrier that precedes the w, u items, the first reader of vs; v is not copied anywhere else."""
    for c in (PREFILL_CELLS[0], MODEL_VARLEN):
        src = source(TDEF, c, TDEF.default_params() | VLATE_BASE | {"prep_v": "late"})
        prep = src[src.index("kda_chunk_prep("):src.index("kda_chunk_recur(")]
        assert "unsigned char* vs = qs;" in prep
        copies = [m.start() for m in re.finditer(r"stage16\(vs \+ stg<V>", prep)]
        assert len(copies) == 1
        v_copy = copies[0]
        q_reads = [m.start() for m in re.finditer(r"\bqs\b", prep)
                   if not prep.startswith(("qs = ", "qs + stg<K>(t, c), q + e"), m.start())
                   and not prep[:m.start()].endswith("vs = ")]
        q_reads = [i for i in q_reads if not prep[i - 40:i].rstrip().endswith("unsigned char*")]
        assert q_reads and max(q_reads) < v_copy
        assert "__syncthreads();" in prep[max(q_reads):v_copy]
        first_v_read = prep.index("ng < 2 ? ks : vs")
        between = prep[v_copy:first_v_read]
        wait = between.rindex("cp.async.wait_all")
        assert "__syncthreads();" in between[wait:] and "qs" not in between


def test_prep_v_late_fits_six_ctas_an_sm_with_the_same_copies():
    """late builds spill-free with 8 KB less shared memory (36992 B at chunk 32) and registers within
    __launch_bounds__(128, 6): 6 CTAs an SM against early's 5; as many 16-byte copies (LDGSTS), one more wait."""
    from evo.build.sass import disassemble

    for c in (PREFILL_CELLS[0], MODEL_VARLEN):
        p = TDEF.default_params() | VLATE_BASE
        early, late = compile_clean(c, [p, p | {"prep_v": "late"}])
        smem = {v: TDEF.plan(p | {"prep_v": v}, ARCH, c.dtypes_dict(), c.dims_dict())[0][0].smem for v in ("early", "late")}
        assert smem["late"] == smem["early"] - 32 * 128 * 2
        assert prep_smem(p | {"prep_v": "late"}, 128, 128) == prep_smem(p, 128, 128) - 32 * 128 * 2 == 36992
        assert prep_ctas_per_sm(p, early["kda_chunk_prep"].regs) == 5
        assert late["kda_chunk_prep"].regs <= 80
        assert prep_ctas_per_sm(p | {"prep_v": "late"}, late["kda_chunk_prep"].regs) == 6
        sass = {v: disassemble(compile_point(c, p | {"prep_v": v}).cubin, "kda_chunk_prep") for v in ("early", "late")}
        count = {v: {op: sum(1 for x in lines if op in x) for op in ("LDGSTS", "DEPBAR", "HMMA")}
                 for v, lines in sass.items()}
        assert count["late"]["LDGSTS"] == count["early"]["LDGSTS"] and count["late"]["HMMA"] == count["early"]["HMMA"]
        assert count["late"]["DEPBAR"] > count["early"]["DEPBAR"]


# ---- the K-split carry recurrence's u in the ring ------------------------------------------------------------

# kda_prefill_h100_5's B1-T8192 winner: the K-split carry recurrence under the bf16 w, u prep with v staged late
CARRY_BASE = VLATE_BASE | {"prep_v": "late", "kwarps": 2, "warps": 2, "stages": 4, "recur_addr": "carry",
                           "recur_early": "late"}


def u_slot_layout(W: int, KW: int, C: int = 32, V: int = 128) -> tuple[dict, int]:
    """The K-split carry recurrence's u (fp32) in a ring slot, modelled from the rendered formulas: each thread's
    pieces (ou_[0] + j NTH 16 from su + j (NTH / (4 W)) V, asserted equal to piece
    i = tid + j NTH's own swizzled offset and source), and every lane's 4 u words of each token tile n (uo_[n & 1][e]
    plus n / 2 16-row periods) asserted to hold u[8 n + 2 tig + e % 2][vl + 8 (e / 2)]. Returns the slot's byte map
    and the most distinct 4-byte words one bank serves in one warp-wide read."""
    ub = 4
    NTH, RB, P, EPP = 32 * W * KW, 16 * ub * W, ub * W, 16 // ub
    slot: dict[int, tuple[int, int]] = {}
    for tid in range(NTH):
        for j in range(-(-C * P // NTH)):
            i = tid + j * NTH
            if i >= C * P:
                continue
            dst, src = _swz(tid * 16, RB) + j * NTH * 16, (tid // P) * V + EPP * (tid % P) + j * (NTH // P) * V
            assert (dst, src) == (_swz(i * 16, RB), (i // P) * V + EPP * (i % P)), (ub, W, KW, tid, j)
            for e in range(EPP):
                for b in range(ub):
                    assert dst + e * ub + b not in slot
                    slot[dst + e * ub + b] = divmod(src + e, V) if b == 0 else None
    assert len(slot) == C * 16 * W * ub
    ways = 0
    for vg, n, e in product(range(W), range(C // 8), range(4)):
        words: dict[int, set] = {}
        for lane in range(32):
            grp, tig = lane >> 2, lane & 3
            vl, t = 16 * vg + grp, 8 * (n & 1) + 2 * tig
            row, col = t + e % 2, vl + 8 * (e // 2)
            off = _swz((row * 16 * W + col) * ub, RB) + n // 2 * 16 * RB
            assert slot[off] == (8 * n + 2 * tig + e % 2, col), (ub, W, KW, vg, n, e, lane)
            words.setdefault(off // 4 % 32, set()).add(off // 4)
        ways = max(ways, max(len(s) for s in words.values()))
    return slot, ways


@pytest.mark.parametrize("W, KW", [(2, 2), (2, 4), (4, 2), (4, 4)])
def test_carry_u_slot_holds_every_u_word_where_each_lane_reads_it(W: int, KW: int):
    """The ring's u pieces (carried: one slot offset and one source pointer apart by constants) and the lanes' u words
    agree, and each warp-wide read of them is conflict-free."""
    src = source(TDEF, PREFILL_CELLS[0], TDEF.default_params() | CARRY_BASE | {"warps": W, "kwarps": KW})
    for line in ("ou_[j] = (unsigned)(OFF_U + swz<64 * W>(i * 16));", "su_[j] = (i / (4 * W)) * V + v0 + 4 * (i % (4 * W));",
                 "cp(d + ou_[0] + (unsigned)(j * NTH * 16), su + j * (NTH / (4 * W)) * V);",
                 "uo_[h][1] = (unsigned)(OFF_U + swz<64 * W>(((t + 1) * 16 * W + vl) * 4));",
                 "sl + uo_[n & 1][e] + (unsigned)(n / 2 * 16 * 64 * W)"):
        assert line in src, line
    assert u_slot_layout(W, KW)[1] == 1

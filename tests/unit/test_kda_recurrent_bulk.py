"""KDA decode streamed through a bulk-copy ring (templates/kda/recurrent_bulk.cu.j2) on the CPU: it compiles
with real NVRTC for sm_90a on every decode cell and the T = 1 edge and gate cells it admits, refuses what it
does not implement, keeps every bulk copy 16-byte aligned inside shared memory's limits, and a numpy
emulation of its algorithm (same work units, thread layout, reductions and fp32 order) matches the float64
reference within the spec's tolerance, also through the real gate on the fake device."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from evo.build.nvrtc import prepare
from tests.unit.nvrtc_memo import compile_memo
from evo.core.genome import Genome
from evo.templates.template import load_templates
from ops.kda import SPEC
from ops.kda.reference import BetaAct, Gate, Variant
from ops.kda.spec import cell, gate_cells, variant_of
from evo.core.spec import Cell, DType, quantize
from tests.unit.test_kda_recurrent import KdaFakeDevice, emulation_inputs, gate_on_fake, passes

BF, FP16, FP32 = DType.BF16, DType.FP16, DType.FP32
TDEF = load_templates("kda")["recurrent_bulk"]
DECODE = [c for c in SPEC.matrix() if c.dim("T") == 1]
ARCH = 90
SMALL = {"v_tile": 16, "vec": 1, "threads": 128, "rows_per_copy": 1}  # fits K = V = 16


def compile_point(c: Cell, params: dict):
    g = Genome.make("kda", "recurrent_bulk", TDEF.source_hash, params)
    return compile_memo(prepare(TDEF, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))


def legal_points(c: Cell) -> list[dict]:
    space = dict(TDEF.space)
    pts = (dict(zip(space, vals)) for vals in itertools.product(*space.values()))
    return [p for p in pts if TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict())]


# ---- NVRTC and the constraints ------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["bulk", "st"])
@pytest.mark.parametrize("c", DECODE, ids=lambda c: f"B{c.dim('B')}")
def test_default_point_compiles_without_spills_on_every_decode_cell(c: Cell, store: str):
    p = TDEF.default_params() | {"store": store}
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    r = compile_point(c, p)
    assert r.status.ok, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF" and "sm_90a" in r.log
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0


def test_a_sample_of_legal_points_compiles_without_spills():
    """The register constraint keeps legal points off the spill path (a seeded sample over the space)."""
    c = DECODE[2]
    points = legal_points(c)
    assert len(points) > 500
    for p in random.Random(0).sample(points, 10):
        r = compile_point(c, p)
        assert r.status.ok, (p, r.error)
        assert r.spill_stores == 0 and r.stack_bytes == 0, (p, r.regs, r.spill_stores)


def test_every_legal_point_keeps_its_copies_aligned_and_its_ring_in_shared_memory():
    """What cp.async.bulk needs (16-byte sizes and addresses) and what the SM has (227 KiB a block), on
    every legal point of the decode cells: derived here from the layout, not from the constraints."""
    for c in DECODE[2:]:
        K, V, xb, sb, gb = c.dim("K"), c.dim("V"), c.dtype("x").nbytes, c.dtype("state").nbytes, c.dtype("g").nbytes
        for p in legal_points(c):
            vt, rpc = p["v_tile"], p["rows_per_copy"]
            piece = rpc * vt * sb
            offs = [K * vt * sb, K * vt * sb + K * xb, K * vt * sb + 2 * K * xb, K * vt * sb + 2 * K * xb + K * gb]
            assert piece % 16 == 0 and all(o % 16 == 0 for o in offs) and (vt * xb) % 16 == 0, p
            assert rpc == 1 or vt == V, p  # a piece of several rows is contiguous in global memory
            (launch,), _ = TDEF.plan(p, ARCH, c.dtypes_dict(), c.dims_dict())
            static = 2 * (p["threads"] // 32) * (vt + 2) * 4 + 8 * p["stages"]
            assert launch.smem % 128 == 0 and launch.smem + static <= 227 * 1024, p
            assert launch.smem >= p["stages"] * (offs[-1] + vt * xb)


def _edge_cells() -> list[Cell]:
    cells = [*SPEC.edge_cells(), *(g for c in DECODE for g in gate_cells(c))]
    out: list[Cell] = []
    for c in cells:
        fit = SMALL if c.dim("V") < 128 else {}
        if c not in out and TDEF.is_valid(TDEF.default_params() | fit, ARCH, c.dtypes_dict(), c.dims_dict()):
            out.append(c)
    return out


EDGE = _edge_cells()


def test_the_template_admits_the_one_token_edge_and_gate_cells():
    assert any(c.dim("K") == 16 for c in EDGE) and any(c.dim("B") == 3 for c in EDGE)
    assert all(c.dim("T") == 1 for c in EDGE)


@pytest.mark.parametrize("c", EDGE, ids=lambda c: c.label())
def test_every_admitted_edge_cell_compiles(c: Cell):
    r = compile_point(c, TDEF.default_params() | (SMALL if c.dim("V") < 128 else {}))
    assert r.status.ok, r.error + r.log
    assert r.spill_stores == 0


@pytest.mark.parametrize("c, why", [
    (cell(BF, 2, 2, 2, 16, 16), "one_token"),
    (cell(BF, 1, 5, 2, 16, 16, n=2), "one_token"),  # varlen: T is the packed length
    (cell(BF, 2, 1, 2, 16, 16, variant=Variant(Gate.SOFTPLUS)), "gate_is_log_space"),
    (cell(BF, 2, 1, 2, 16, 16, variant=Variant(v_first=True)), "state_is_k_first"),
], ids=lambda v: v if isinstance(v, str) else v.label())
def test_unimplemented_variants_are_refused_by_constraints(c: Cell, why: str):
    assert why in TDEF.violations(TDEF.default_params() | SMALL, ARCH, c.dtypes_dict(), c.dims_dict())


# ---- the template's algorithm, emulated in numpy ------------------------------------------------------

def butterfly(x: np.ndarray, axis: int) -> np.ndarray:
    """The kernel's xor shuffles over the lanes that share columns (the SUB row groups of a warp)."""
    n = x.shape[axis]
    o = n // 2
    while o > 0:
        x = x + np.take(x, np.arange(n) ^ o, axis=axis)
        o //= 2
    return x


def emulate(inputs: dict, scal: dict, c: Cell, p: dict, bug: str = "") -> dict[str, np.ndarray]:
    """templates/kda/recurrent_bulk.cu.j2 in numpy, fp32: every work unit at once, each unit's slot as
    the bulk copies fill it, every thread's interleaved rows, the warp butterflies and the warps' sums in
    the kernel's order; outputs start as NaN, so an element no unit writes fails."""
    f = np.float32
    K, V, H, HV, N = (c.dim(d) for d in ("K", "V", "H", "HV", "N"))
    vt, vec, threads = p["v_tile"], p["vec"], p["threads"]
    NW, CG = threads // 32, vt // vec
    SUB = 32 // CG
    RG, NT = NW * SUB, V // vt
    R = K // RG
    var = variant_of(c)
    q, k, v, g, beta = (np.asarray(inputs[n], f).reshape(-1) for n in ("q", "k", "v", "g", "beta"))
    h0 = np.asarray(inputs.get("initial_state", np.zeros((N, HV, K, V))), f).reshape(-1)
    o = np.full(N * HV * V, np.nan, f)
    ht = np.full(N * HV * K * V, np.nan, f)
    u = np.arange(N * HV * NT)
    vti, hv, n = u % NT, (u // NT) % HV, u // (NT * HV)
    h = hv % H if bug == "head" else hv // (HV // H)
    nh = n * HV + hv
    ks_, vs_ = np.arange(K), np.arange(vt)
    tile_at = (nh * K * V + vti * vt)[:, None, None] + ks_[None, :, None] * V + vs_[None, None, :]  # [U, K, vt]
    tile = h0[tile_at]
    qs, ksl = q[((n * H + h) * K)[:, None] + ks_], k[((n * H + h) * K)[:, None] + ks_]
    gs = g[(nh * K)[:, None] + ks_]
    vs = v[(nh * V + vti * vt)[:, None] + vs_]
    b = beta[nh]
    with np.errstate(over="ignore"):
        if var.beta_act is not BetaAct.NONE:
            b = f(2 if var.beta_act is BetaAct.SIGMOID2 else 1) / (f(1) + np.exp(-b))
    rows = np.arange(RG)[:, None] + RG * np.arange(R)[None, :]  # [RG, R]: thread row group rg's rows
    if bug == "rows":
        rows = rows % (K // 2)  # half the rows read twice, half never
    cols = np.arange(CG)[:, None] * vec + np.arange(vec)[None, :]  # [CG, VEC]
    st = tile[:, rows[:, :, None, None], cols[None, None]]  # [U, RG, R, CG, VEC]
    d = np.exp(gs[:, rows])
    kr, qr = ksl[:, rows], qs[:, rows]  # [U, RG, R]

    def total(part: np.ndarray) -> np.ndarray:  # [U, RG, ...] -> [U, ...]: butterfly in a warp, then warps in order
        w = butterfly(part.reshape(part.shape[0], NW, SUB, *part.shape[2:]), 2)[:, :, 0]
        acc = np.zeros_like(w[:, 0])
        for x in range(NW):
            acc = acc + w[:, x]
        return acc

    acc = np.zeros(st.shape[:2] + st.shape[3:], f)
    sq = np.zeros(st.shape[:2], f)
    sk = np.zeros(st.shape[:2], f)
    for i in range(R):
        st[:, :, i] = st[:, :, i] * d[:, :, i, None, None]
        acc = acc + kr[:, :, i, None, None] * st[:, :, i]
        sq, sk = sq + qr[:, :, i] * qr[:, :, i], sk + kr[:, :, i] * kr[:, :, i]
    kS = total(acc)  # [U, CG, VEC]
    scale = f(scal["scale"])
    if var.qk_l2norm:
        nq = scale / np.sqrt(total(sq) + f(1e-6))
        nk = f(1) / np.sqrt(total(sk) + f(1e-6))
    else:
        nq, nk = np.full(len(u), scale, f), np.ones(len(u), f)
    uu = b[:, None, None] * (vs[:, cols] - nk[:, None, None] * kS) * nk[:, None, None]
    acc = np.zeros_like(acc)
    for i in range(R):
        st[:, :, i] = st[:, :, i] + kr[:, :, i, None, None] * uu[:, None]
        acc = acc + qr[:, :, i, None, None] * st[:, :, i]
    out = nq[:, None, None] * total(acc)
    new = np.full_like(tile, np.nan)
    new[:, rows[:, :, None, None], cols[None, None]] = quantize(st, c.dtype("state")).astype(f)
    ht[tile_at] = new
    o[(nh * V + vti * vt)[:, None, None] + cols[None]] = out
    return {"o": quantize(o.astype(np.float64).reshape(N, 1, HV, V), c.dtype("x")),
            "final_state": quantize(ht.astype(np.float64).reshape(N, HV, K, V), c.dtype("state"))}


EMU_CASES = [
    (cell(BF, 2, 1, 2, 16, 16), SMALL),
    (cell(BF, 3, 1, 1, 16, 32, hv=2), {"v_tile": 32, "vec": 2, "threads": 128, "rows_per_copy": 1}),
    (cell(BF, 2, 1, 2, 32, 64, hv=4, variant=Variant(qk_l2norm=True)),
     {"v_tile": 32, "vec": 4, "threads": 256, "rows_per_copy": 1}),
    (cell(BF, 2, 1, 1, 16, 32, variant=Variant(beta_act=BetaAct.SIGMOID)),
     {"v_tile": 32, "vec": 1, "threads": 128, "rows_per_copy": 1}),
    (cell(BF, 1, 1, 1, 16, 16, variant=Variant(beta_act=BetaAct.SIGMOID2, qk_l2norm=True)), SMALL),
    (cell(FP16, 2, 1, 1, 16, 16, g=FP16), SMALL),
    (cell(FP32, 2, 1, 1, 16, 16), SMALL),
    (cell(BF, 2, 1, 1, 32, 32, state=BF), {"v_tile": 32, "vec": 2, "threads": 128, "rows_per_copy": 1}),
    (cell(BF, 3, 1, 2, 128, 128), {}),  # the decode matrix's shape, fewer heads and sequences
    (cell(BF, 2, 1, 2, 128, 128), {"v_tile": 64, "vec": 2, "threads": 512, "rows_per_copy": 1}),
    (cell(BF, 2, 1, 2, 128, 128), {"v_tile": 128, "vec": 4, "threads": 512, "rows_per_copy": 8}),
]


@pytest.mark.parametrize("c, fit", EMU_CASES, ids=[f"{c.label()}-{'-'.join(map(str, p.values()))}" for c, p in EMU_CASES])
def test_emulated_template_matches_the_float64_reference(c: Cell, fit: dict):
    p = TDEF.default_params() | fit
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    scal = SPEC.scalar_values(c)
    for kind, source, inputs in emulation_inputs(c):
        want, got = SPEC.reference(inputs, scal), emulate(inputs, scal, c, p)
        for name in want:
            ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
            assert ok and share < 0.6, (kind, source, name, share)


@pytest.mark.parametrize("bug", ["head", "rows"])
def test_emulation_catches_a_wrong_mapping(bug: str):
    """The check has teeth: qk head hv % H instead of hv // (HV / H), or a row layout that misses rows, fails."""
    c = cell(BF, 2, 1, 2, 32, 64, hv=4)
    p = TDEF.default_params() | {"v_tile": 32, "vec": 4, "threads": 256, "rows_per_copy": 1}
    inputs = SPEC.make_inputs(c, "normal", np.random.default_rng(1))
    scal = SPEC.scalar_values(c)
    want, got = SPEC.reference(inputs, scal), emulate(inputs, scal, c, p, bug)
    assert not all(passes(got[n], want[n], SPEC.tolerance(c, n))[0] for n in want)


# ---- the real gate on the fake device -------------------------------------------------------------------

def emulated_kernel(c0: Cell, p: dict, bug: str = ""):
    """The template as a fake kernel: N, H, HV from its args (the grid is the persistent one)."""
    def run(dev: KdaFakeDevice, args: tuple) -> None:
        (_, pq), (_, pk), (_, pv), (_, pg), (_, pb), (_, ph0), (_, po), (_, pht), (_, N), (_, H), (_, HV), (_, scale) = args
        units = N * HV * (c0.dim("V") // p["v_tile"])
        assert dev.state["grid"] == (min(units, p["ctas"]), 1, 1)
        c = cell(c0.dtype("x"), N, 1, H, c0.dim("K"), c0.dim("V"), hv=HV, g=c0.dtype("g"), state=c0.dtype("state"),
                 variant=variant_of(c0))
        x, K, V = c.dtype("x"), c.dim("K"), c.dim("V")
        inputs = {"q": dev.read(pq, x, (N, 1, H, K)), "k": dev.read(pk, x, (N, 1, H, K)),
                  "v": dev.read(pv, x, (N, 1, HV, V)), "g": dev.read(pg, c.dtype("g"), (N, 1, HV, K)),
                  "beta": dev.read(pb, x, (N, 1, HV)), "initial_state": dev.read(ph0, c.dtype("state"), (N, HV, K, V))}
        out = emulate(inputs, {"scale": scale}, c, p, bug)
        dev.write(po, x, out["o"])
        dev.write(pht, c.dtype("state"), out["final_state"])
        dev.clock += SPEC.bytes_moved(c) / 3e6  # an honest kernel's time at 3 TB/s
    return run


def test_the_store_modes_render_their_own_paths():
    """store = bulk: in-place writes, bulk stores, a wait for their reads before a refill; store = st: vector
    stores from registers, no bulk store, the slot refilled right after the unit's last barrier."""
    c = DECODE[2]
    src = {m: prepare(TDEF, Genome.make("kda", "recurrent_bulk", TDEF.source_hash, TDEF.default_params() | {"store": m}),
                      "sm_90a", c.dtypes_dict(), c.dims_dict()).source for m in ("bulk", "st")}
    assert "kfb::bulk_store<" in src["bulk"] and "kfb::bulk_wait_read<1>()" in src["bulk"]
    assert "kfb::bulk_store<" not in src["st"] and "bulk_wait" not in src["st"].split("kda_recurrent_bulk(")[1]
    assert "kf::store<VEC * 4>(ht + " in src["st"] and "u + S * G" in src["st"]


@pytest.mark.parametrize("bug", ["", "rows"])
def test_the_gate_runs_the_bulk_template_end_to_end_on_the_fake_device(bug: str):
    """make_job's job for this template (N as an arg, cu_seqlens not bound, the persistent grid) through the
    real Gate with its gate cells: OK, and WRONG_ANSWER with a bug."""
    from evo.measure.evaluate import make_job
    from evo.measure.evaluators import gate_cells_for
    from evo.measure.jobs import Timing

    c = cell(BF, 4, 1, 2, 32, 32)
    p = TDEF.default_params() | {"v_tile": 32, "vec": 2, "threads": 128, "rows_per_copy": 1, "ctas": 132}
    g = Genome.make("kda", "recurrent_bulk", TDEF.source_hash, p)
    gates = gate_cells_for(SPEC, TDEF, g, c, ARCH)
    assert gates and all(x.dim("T") == 1 for x in gates)
    build = compile_point(c, p)
    assert build.status.ok, build.error
    job = make_job(SPEC, TDEF, g, build, c, ARCH, seed=3, timing=Timing(min_samples=100, max_samples=100, warmup=2),
                   baseline=False, gate_cells=gates)
    assert set(job.left_out) == {"A_log", "dt_bias", "cu_seqlens"}
    assert [(a[0], a[1]) for a in job.launches[0].args][-4:] == [("i32", 4), ("i32", 2), ("i32", 2), ("f32", 32 ** -0.5)]
    res = gate_on_fake(KdaFakeDevice({"kda_recurrent_bulk": emulated_kernel(c, p, bug)}), job, g, c, build, bug)
    if not bug:
        assert len(res.times_us) >= 100

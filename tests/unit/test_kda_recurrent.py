"""KDA decode on the CPU: the recurrent template compiles with real NVRTC for sm_90a on every decode cell
and every edge cell it admits, refuses the variants it does not implement, and a numpy emulation of its
algorithm (same grid, thread layout, index arithmetic and fp32 operation order) matches the float64
reference within the spec's tolerance; the device reference and support kernels compile; the gate's
fills of KDA's kinds (numpy fake device) have make_inputs' statistics."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

from evo.build.nvrtc import include_dir, parse_ptxas, prepare
from tests.unit.nvrtc_memo import compile_memo
from evo.core.genome import Genome
from evo.templates.template import load_templates
from ops.kda import SPEC
from ops.kda import device as kda_device
from ops.kda.reference import BetaAct, Gate, Variant
from ops.kda.spec import DECODE_B, FILLS, MODEL, cell, gate_cells, is_varlen, variant_of
from evo.core.spec import Cell, DType, Tolerance, from_device_bytes, quantize, to_device_bytes
from tests.unit.fake_device import FakeDevice

BF, FP16, FP32 = DType.BF16, DType.FP16, DType.FP32
TDEF = load_templates("kda")["recurrent"]
DECODE = [c for c in SPEC.matrix() if c.dim("T") == 1]
ARCH = 90


def compile_point(c: Cell, params: dict):
    g = Genome.make("kda", "recurrent", TDEF.source_hash, params)
    return compile_memo(prepare(TDEF, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))


def legal_points(c: Cell, n: int, seed: int = 0) -> list[dict]:
    """n distinct legal parameter points on c (the default first), drawn from the declared space."""
    rng = random.Random(seed)
    space = dict(TDEF.space)
    out = [TDEF.default_params()]
    for _ in range(20000):
        if len(out) == n:
            break
        p = {k: rng.choice(v) for k, v in space.items()}
        if p not in out and TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict()):
            out.append(p)
    return out


# ---- NVRTC ---------------------------------------------------------------------------------------

def test_decode_matrix_is_what_the_template_serves():
    assert [c.dim("B") for c in DECODE] == list(DECODE_B)
    for c in DECODE:
        assert TDEF.violations(TDEF.default_params(), ARCH, c.dtypes_dict(), c.dims_dict()) == []


@pytest.mark.parametrize("c", DECODE, ids=lambda c: f"B{c.dim('B')}-T1-H{c.dim('H')}")
def test_default_point_compiles_without_spills_on_every_decode_cell(c: Cell):
    r = compile_point(c, TDEF.default_params())
    assert r.status.ok, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF" and "sm_90a" in r.log
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0
    assert 32 <= r.regs <= 255


def test_legal_points_compile_without_spills_on_a_decode_cell():
    """The register constraints keep every legal point off the spill path (a sample of the space)."""
    c = DECODE[2]
    points = legal_points(c, 14)
    assert len(points) == 14
    for p in points:
        r = compile_point(c, p)
        assert r.status.ok, (p, r.error)
        assert r.spill_stores == 0, (p, r.regs, r.spill_stores)


@pytest.mark.parametrize("point", [{"k_lanes": 4, "v_tile": 32, "vec": 2}, {"k_lanes": 8, "v_tile": 32, "vec": 2}],
                         ids=["kl4", "kl8"])
def test_staging_q_k_g_in_shared_memory_frees_registers(point: dict):
    """qkg = smem: the same point needs fewer registers than qkg = regs (what it is for), builds without
    spills, and reads the staged rows through the padded layout (no per-thread q/k/g arrays left)."""
    c = DECODE[2]
    r = {q: compile_point(c, TDEF.default_params() | point | {"qkg": q}) for q in ("regs", "smem")}
    assert all(x.status.ok and x.spill_stores == 0 for x in r.values()), {q: x.error for q, x in r.items()}
    assert r["smem"].regs < r["regs"].regs, (r["smem"].regs, r["regs"].regs)
    g = Genome.make("kda", "recurrent", TDEF.source_hash, TDEF.default_params() | point | {"qkg": "smem"})
    src = prepare(TDEF, g, "sm_90a", c.dtypes_dict(), c.dims_dict()).source
    R = 128 // point["k_lanes"]
    assert f"qkg_s[1][kl * {R + 1} + r]" in src and "float qr[R]" not in src


def test_staging_in_shared_memory_is_refused_where_it_would_spill():
    """The register constraint counts the staged point's state and addressing: 16 rows x 4 columns at 8
    blocks of 128 threads (64 registers) spills, so it is illegal; at 4 blocks (128) it builds clean."""
    c = DECODE[2]
    p = TDEF.default_params() | {"k_lanes": 8, "v_tile": 64, "vec": 4, "min_blocks": 8, "qkg": "smem"}
    assert "register_budget" in TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict())
    r = compile_point(c, p)
    assert r.status.ok and r.spill_stores > 0
    p4 = p | {"min_blocks": 4}
    assert TDEF.violations(p4, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    r4 = compile_point(c, p4)
    assert r4.status.ok and r4.spill_stores == 0


def admitted_edge_cells() -> list[Cell]:
    """Edge cells and the decode cells' gate cells the default point admits (what the gate runs it on)."""
    cells = [*SPEC.edge_cells(), *(g for c in DECODE for g in gate_cells(c))]
    seen: list[Cell] = []
    for c in cells:
        if c not in seen and TDEF.is_valid(TDEF.default_params() | _fit(c), ARCH, c.dtypes_dict(), c.dims_dict()):
            seen.append(c)
    return seen


def _fit(c: Cell) -> dict:
    """The default point shrunk to a small cell's K and V (v_tile <= V, K / k_lanes rows, whole warps)."""
    if c.dim("K") >= 128 and c.dim("V") >= 32:
        return {}
    return {"v_tile": min(16, c.dim("V")), "vec": 2 if c.dtype("x").nbytes == 2 else 1, "k_lanes": 4}


EDGE = admitted_edge_cells()


def test_the_template_admits_small_edge_cells_of_each_dtype_and_variant_it_implements():
    labels = {(c.dtype("x"), c.dtype("state"), variant_of(c)) for c in EDGE}
    assert (BF, FP32, Variant()) in labels and (BF, BF, Variant()) in labels and (FP16, FP32, Variant()) in labels
    assert any(c.dim("T") > 1 for c in EDGE) and any(c.dim("H") > 1 for c in EDGE)


@pytest.mark.parametrize("c", EDGE, ids=lambda c: c.label())
def test_every_admitted_edge_cell_compiles(c: Cell):
    r = compile_point(c, TDEF.default_params() | _fit(c))
    assert r.status.ok, r.error + r.log
    assert r.spill_stores == 0


@pytest.mark.parametrize("c, why", [
    (cell(BF, 2, 1, 2, 16, 16, variant=Variant(Gate.SOFTPLUS)), "gate_is_log_space"),
    (cell(BF, 2, 1, 2, 16, 16, variant=Variant(Gate.LOWER_BOUND)), "gate_is_log_space"),
    (cell(BF, 2, 1, 2, 16, 16, variant=Variant(v_first=True)), "state_is_k_first"),
    (cell(BF, 1, 65, 1, 16, 16), "short_sequences"),
    (cell(BF, 2, 1, 2, 16, 16, hv=4, g=BF, state=BF, variant=MODEL), "gate_is_log_space"),
], ids=lambda v: v if isinstance(v, str) else v.label())
def test_unimplemented_variants_are_refused_by_constraints(c: Cell, why: str):
    """The search can never pick the template where it would be wrong: each such cell breaks a named rule."""
    p = TDEF.default_params() | _fit(c)
    assert why in TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict())
    for e in SPEC.edge_cells():
        v = variant_of(e)
        if v.gate is not Gate.LOG or v.v_first or e.dim("T") > 64:
            assert not TDEF.is_valid(p, ARCH, e.dtypes_dict(), e.dims_dict()), e.label()


def _nvrtc(src: str) -> tuple[bytes, dict]:
    from cuda.core import Program, ProgramOptions

    log = io.StringIO()
    opts = ProgramOptions(arch="sm_90a", std="c++17", include_path=[include_dir()], ptxas_options=["-v"])
    obj = Program(src, code_type="c++", options=opts).compile("cubin", logs=log)
    return obj.code, parse_ptxas(log.getvalue())


def test_device_reference_compiles_with_a_kernel_for_every_cell_dtype():
    _, res = _nvrtc(kda_device.SOURCE.read_text())
    cells = [*SPEC.matrix(), *SPEC.edge_cells(), cell(FP32, 1, 2, 1, 16, 16, g=FP16)]
    for c in cells:
        (kernel, grid, block, args), = kda_device.reference(c.dims_dict(), c.dtypes_dict(), SPEC.scalar_values(c))
        assert kernel in res, kernel
        assert grid == (-(-c.dim("V") // 64), c.dim("HV"), c.dim("N")) and block == (64, 1, 1)
        names = {v for k, v in args if k == "buf"}
        assert names == {t.name for t in SPEC.inputs()} | {f"ref:{t.name}" for t in SPEC.outputs()}


def test_support_kernels_compile_with_the_new_fills():
    from evo.measure.worker import SUPPORT

    _, res = _nvrtc(SUPPORT.read_text())
    assert {"kf_offsets_i32", "kf_l2norm_rows_bf16", "kf_l2norm_rows_f16", "kf_l2norm_rows_f32",
            "kf_fill_bf16"} <= set(res)


# ---- the gate's fills of KDA's kinds -----------------------------------------------------------------

def device_fill(c: Cell, kind: str, seed: int = 3) -> dict[str, np.ndarray]:
    """Every input the gate fills for kind on c, through the numpy fake device, read back as float64."""
    dev = FakeDevice({})
    out = {}
    for i, t in enumerate(SPEC.inputs()):
        if t.name == "cu_seqlens" and not is_varlen(c):  # a plan binds it on varlen cells only
            continue
        dt = t.resolve_dtype(c)
        shape = t.shape(c)
        n = int(np.prod(shape))
        buf = dev.alloc(n * dt.nbytes)
        dev.fill(buf, dt.value, n, shape[-1], FILLS[kind][t.name].bind(c.dims_dict()), seed + i)
        raw = dev.data(buf).view({BF: np.uint16, FP16: np.float16, FP32: np.float32, DType.INT32: np.int32}[dt])
        out[t.name] = from_device_bytes(raw, dt).reshape(shape)
    return out


def gate_on_fake(dev: "KdaFakeDevice", job, g, c: Cell, build, bug: str | None):
    """The real gate on the numpy device: WRONG_ANSWER with a planted bug, OK without; the run's result."""
    from evo.core.status import Status
    from evo.measure.gate import Gate as GateRun
    from evo.measure.verify import judge

    res = GateRun(dev, job, "cand", "ref", kda_device, random.Random(0), (("gpu", "fake"),), dev.ceiling_gbps).run()
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    if bug:
        assert out.status is Status.WRONG_ANSWER, out
    else:
        assert out.status is Status.OK, (out.status, out.error, res.checks[-2:], res.input_faults)
    return res


def emulation_inputs(c: Cell):
    """(kind, source, inputs) over every fill kind, from the spec's make_inputs and from the gate's device
    fill: the inputs an emulated template is checked on (the raw-gate tensors left out; cu_seqlens on varlen
    cells, where make_inputs and the fill give uneven lengths)."""
    for kind in SPEC.gate_kinds():  # the causal check's loud kind only ever fills a suffix
        yield kind, "make_inputs", SPEC.make_inputs(c, kind, np.random.default_rng(1))
        fill = device_fill(c, kind)
        yield kind, "gate fill", {n: a for n, a in fill.items() if n not in ("A_log", "dt_bias")}


STATS_CELL = cell(BF, 4, 64, 4, 128, 128, n=None)


@pytest.mark.parametrize("kind", list(FILLS))
def test_fills_have_make_inputs_statistics(kind: str):
    got = device_fill(STATS_CELL, kind)
    want = SPEC.make_inputs(STATS_CELL, kind, np.random.default_rng(0))
    for name in ("q", "k"):
        norms = np.linalg.norm(got[name], axis=-1)
        if kind == "no_state":  # rows of norm ~0.04 sqrt(K): stable unnormalized, wrong for a skipped norm
            assert 0.3 < np.median(norms) < 0.6
        else:
            np.testing.assert_allclose(norms, np.linalg.norm(want[name], axis=-1), atol=0.01)
    assert abs(np.std(got["v"]) - np.std(want["v"])) < 0.05 * np.std(want["v"])
    # log decays: g = -exp(N(mu, sigma)), so log(-g) has make_inputs' mean and spread
    lg, lw = np.log(-got["g"]), np.log(-want["g"])
    assert np.all(got["g"] < 0)
    assert abs(np.mean(lg) - np.mean(lw)) < 0.1 and abs(np.std(lg) - np.std(lw)) < 0.1
    assert np.all((got["beta"] >= 0) & (got["beta"] <= 1))
    if kind == "beta_large":
        sat = lambda b: np.mean((b < 1e-3) | (b > 1 - 1e-3))  # noqa: E731
        assert sat(got["beta"]) > 0.8 and sat(want["beta"]) > 0.99
    else:
        assert abs(np.mean(got["beta"]) - np.mean(want["beta"])) < 0.05
    if kind == "no_state":
        assert "initial_state" not in want and np.all(got["initial_state"] == 0)
    else:
        assert abs(np.std(got["initial_state"]) - np.std(want["initial_state"])) < 0.01


def test_offsets_fill_is_valid_cu_seqlens_on_varlen_cells():
    lengths = {}
    # the matrix's 8192-token cell at one seed (its fill is 3 s, a GB of float64), the small cells at five
    for c in (cell(BF, 1, 7, 2, 16, 16, n=3), cell(BF, 1, 8192, 32, n=8), cell(BF, 1, 5, 1, 16, 16, n=5)):
        for seed in (1,) if c.dim("T") == 8192 else range(5):
            fill = device_fill(c, "normal", seed)
            lengths[c.dim("T"), seed] = np.diff(fill["cu_seqlens"])
            cu = fill["cu_seqlens"]
            assert cu[0] == 0 and cu[-1] == c.dim("T") and len(cu) == c.dim("N") + 1
            assert np.all(np.diff(cu) >= 1)
            inputs = {k: v for k, v in fill.items() if k not in ("A_log", "dt_bias")}
            if c.dim("H") > 2:  # heads are independent and filled alike: two of them stand for all (the reference's
                inputs = {k: v if k == "cu_seqlens" else v[:, :2] if k == "initial_state" else v[:, :, :2]
                          for k, v in inputs.items()}  # cost is a head's, 25 s a seed at T = 8192 with all 32)
            assert np.all(np.isfinite(SPEC.reference(inputs, SPEC.scalar_values(c))["o"]))
    assert lengths[8192, 1].max() > 4 * lengths[8192, 1].min()  # uneven


# ---- the template's algorithm, emulated in numpy ------------------------------------------------------

def lanes_sum(x: np.ndarray, kl: int) -> np.ndarray:
    """The kernel's xor butterfly over the kl consecutive lanes of a column group (last axis: threads)."""
    shape = x.shape
    y = x.reshape(*shape[:-1], shape[-1] // kl, kl)
    lane = np.arange(kl)
    o = kl // 2
    while o > 0:
        y = y + y[..., lane ^ o]
        o //= 2
    return y.reshape(shape)


def emulate(inputs: dict, scal: dict, c: Cell, p: dict) -> dict[str, np.ndarray]:
    """templates/kda/recurrent.cu.j2 in numpy, fp32: every CTA and thread of the grid at once, the same
    flat offsets and per-thread loops (qkg = smem: the staged path's order); outputs start as NaN, so an
    element no thread writes fails."""
    f = np.float32
    K, V, T, H, HV, N = (c.dim(d) for d in ("K", "V", "T", "H", "HV", "N"))
    vt, vec, KL = p["v_tile"], p["vec"], p["k_lanes"]
    staged = p.get("qkg") == "smem"  # q, k, exp(g) staged unnormalized: the norms and scale applied to the sums
    R, threads = K // KL, (vt // vec) * KL
    var = variant_of(c)
    q, k, v, g, beta = (np.asarray(inputs[n], f).reshape(-1) for n in ("q", "k", "v", "g", "beta"))
    h0 = np.asarray(inputs.get("initial_state", np.zeros((N, HV, K, V))), f).reshape(-1)
    cu = inputs.get("cu_seqlens")
    B = c.dim("B")
    o = np.full(B * T * HV * V, np.nan, f)
    ht = np.full(N * HV * K * V, np.nan, f)
    n_, hv_, bx, t = np.meshgrid(np.arange(N), np.arange(HV), np.arange(V // vt), np.arange(threads), indexing="ij")
    kl = t % KL
    col = bx * vt + (t // KL) * vec
    h = hv_ // (HV // H)
    state_at = (n_ * HV + hv_) * K * V + kl * R * V + col
    rows, js = np.arange(R), np.arange(vec)
    at = state_at[..., None, None] + rows[:, None] * V + js  # [..., R, VEC]
    s = h0[at]
    scale = f(scal["scale"])
    # the sequence's tokens: row n, or (varlen) cu[n] .. cu[n + 1] - 1; a thread past its sequence's end idles
    bos = n_ * T if cu is None else np.asarray(cu, np.int64)[n_]
    ln = np.full(n_.shape, T) if cu is None else np.diff(np.asarray(cu, np.int64))[n_]
    for i in range(int(ln.max())):
        live = i < ln
        tok = bos + np.minimum(i, ln - 1)
        s_before = s.copy()
        qr = q[((tok * H + h) * K + kl * R)[..., None] + rows]
        kr = k[((tok * H + h) * K + kl * R)[..., None] + rows]
        gr = g[((tok * HV + hv_) * K + kl * R)[..., None] + rows]
        vp = v[((tok * HV + hv_) * V + col)[..., None] + js]
        b = beta[tok * HV + hv_]
        with np.errstate(over="ignore"):
            if var.beta_act is not BetaAct.NONE:
                b = f(2 if var.beta_act is BetaAct.SIGMOID2 else 1) / (f(1) + np.exp(-b))
        if var.qk_l2norm:
            sq, sk = np.zeros(t.shape, f), np.zeros(t.shape, f)
            for r in range(R):
                sq, sk = sq + qr[..., r] * qr[..., r], sk + kr[..., r] * kr[..., r]
            nq = scale / np.sqrt(lanes_sum(sq, KL) + f(1e-6))
            nk = f(1) / np.sqrt(lanes_sum(sk, KL) + f(1e-6))
            if not staged:
                qr, kr = qr * nq[..., None], kr * nk[..., None]
        elif not staged:
            qr = qr * scale
        else:
            nq = np.full(t.shape, scale, f)
        acc = np.zeros((*t.shape, vec), f)
        for r in range(R):
            s[..., r, :] = s[..., r, :] * np.exp(gr[..., r])[..., None]
            acc = acc + kr[..., r, None] * s[..., r, :]
        ks = np.moveaxis(lanes_sum(np.moveaxis(acc, -1, 0), KL), 0, -1)
        if staged and var.qk_l2norm:  # (k / |k|) u with k unnormalized in the update
            u = b[..., None] * (vp - nk[..., None] * ks) * nk[..., None]
        else:
            u = b[..., None] * (vp - ks)
        acc = np.zeros((*t.shape, vec), f)
        for r in range(R):
            s[..., r, :] = s[..., r, :] + kr[..., r, None] * u
            acc = acc + qr[..., r, None] * s[..., r, :]
        out = np.moveaxis(lanes_sum(np.moveaxis(acc, -1, 0), KL), 0, -1)
        if staged:
            out = nq[..., None] * out
        first = (kl == 0) & live
        o[(((tok * HV + hv_) * V + col)[..., None] + js)[first]] = out[first]
        s = np.where(live[..., None, None], s, s_before)
    ht[at] = s
    return {"o": quantize(o.astype(np.float64).reshape(B, T, HV, V), c.dtype("x")),
            "final_state": quantize(ht.astype(np.float64).reshape(N, HV, K, V), c.dtype("state"))}


def passes(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[bool, float]:
    """The gate's verdict (finite, elementwise, RMS-relative) and the share of rel_norm used."""
    if not np.all(np.isfinite(got)):
        return False, np.inf
    d = np.abs(got - want)
    rel = float(np.sqrt(np.sum(d * d) / np.sum(want * want)))
    return bool(np.all(d <= tol.atol + tol.rtol * np.abs(want)) and rel <= tol.rel_norm), rel / tol.rel_norm


EMU_CASES = [
    (cell(BF, 2, 1, 2, 16, 16), {"v_tile": 16, "vec": 2, "k_lanes": 4}),
    (cell(BF, 3, 1, 2, 16, 16), {"v_tile": 8, "vec": 1, "k_lanes": 4}),
    (cell(BF, 2, 3, 2, 32, 16, hv=4), {"v_tile": 16, "vec": 4, "k_lanes": 8}),
    (cell(BF, 2, 5, 1, 64, 32, variant=Variant(qk_l2norm=True)), {"v_tile": 32, "vec": 4, "k_lanes": 4}),
    (cell(BF, 1, 4, 1, 16, 32, state=BF), {"v_tile": 32, "vec": 8, "k_lanes": 8}),
    (cell(BF, 2, 2, 2, 16, 16, variant=Variant(beta_act=BetaAct.SIGMOID)), {"v_tile": 16, "vec": 1, "k_lanes": 2}),
    (cell(BF, 1, 3, 1, 16, 16, variant=Variant(beta_act=BetaAct.SIGMOID2, qk_l2norm=True)),
     {"v_tile": 16, "vec": 2, "k_lanes": 4}),
    (cell(FP16, 2, 3, 1, 16, 16, g=FP16), {"v_tile": 16, "vec": 4, "k_lanes": 8}),
    (cell(FP32, 2, 2, 1, 16, 16), {"v_tile": 16, "vec": 4, "k_lanes": 8}),
    (cell(BF, 2, 1, 4, 128, 128), {}),  # the decode matrix's shape (fewer heads and sequences)
    (cell(BF, 1, 1, 2, 128, 128), {"v_tile": 128, "vec": 4, "k_lanes": 32}),
    (cell(BF, 1, 2, 2, 128, 128), {"v_tile": 64, "vec": 4, "k_lanes": 16}),
    # varlen (cu_seqlens, B = 1): uneven lengths, and 1..3-token sequences under the varlen kind
    (cell(BF, 1, 7, 2, 16, 16, n=3), {"v_tile": 16, "vec": 2, "k_lanes": 4}),
    (cell(BF, 1, 40, 1, 32, 16, n=5, hv=2, variant=Variant(qk_l2norm=True)), {"v_tile": 16, "vec": 4, "k_lanes": 8}),
    (cell(BF, 1, 16, 2, 128, 128, n=4), {}),
    (cell(BF, 1, 40, 1, 32, 16, n=5, hv=2, variant=Variant(qk_l2norm=True)),
     {"v_tile": 16, "vec": 4, "k_lanes": 8, "qkg": "smem"}),
    (cell(BF, 2, 1, 4, 128, 128), {"qkg": "smem"}),
]


@pytest.mark.parametrize("c, fit", EMU_CASES, ids=[f"{c.label()}-{'-'.join(map(str, p.values()))}" for c, p in EMU_CASES])
def test_emulated_template_matches_the_float64_reference(c: Cell, fit: dict):
    p = TDEF.default_params() | fit
    assert TDEF.violations(p, ARCH, c.dtypes_dict(), c.dims_dict()) == []
    scal = SPEC.scalar_values(c)
    cases = list(emulation_inputs(c))
    if is_varlen(c):
        cases.append(("varlen", "make_inputs", SPEC.make_inputs(c, "varlen", np.random.default_rng(2))))
    for kind, source, inputs in cases:
        want, got = SPEC.reference(inputs, scal), emulate(inputs, scal, c, p)
        for name in want:
            ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
            assert ok and share < 0.6, (kind, source, name, share)


def test_emulation_catches_a_wrong_head_mapping():
    """The check has teeth: the emulation with qk head hv % H instead of hv // (HV / H) fails."""
    c = cell(BF, 2, 3, 2, 32, 16, hv=4)
    p = TDEF.default_params() | {"v_tile": 16, "vec": 4, "k_lanes": 8}
    inputs = SPEC.make_inputs(c, "normal", np.random.default_rng(1))
    scal = SPEC.scalar_values(c)
    want = SPEC.reference(inputs, scal)
    tiled = dict(inputs)
    for n in ("q", "k"):  # the two qk heads swapped: every value head reads the wrong one
        tiled[n] = inputs[n][:, :, [1, 0]]
    got = emulate(tiled, scal, c, p)
    assert not passes(got["o"], want["o"], SPEC.tolerance(c, "o"))[0]


# ---- the real gate on the fake device: the job make_job builds for kda, the emulated kernel ----------

class KdaFakeDevice(FakeDevice):
    """The numpy fake device with KDA's float64 reference, and the launch grid visible to fake kernels."""

    def launch(self, obj, kernel, grid, block, smem, args, side=False, pdl=False):
        if self._capturing is None:
            self.state["grid"] = grid
            if obj == "ref":
                return self._kda_reference(kernel, args)
        return super().launch(obj, kernel, grid, block, smem, args, side, pdl)

    def read(self, ptr: int, dt: DType, shape: tuple) -> np.ndarray:
        n = int(np.prod(shape))
        raw = self.view(ptr, "uint8", n * dt.nbytes).view({BF: np.uint16, FP16: np.float16, FP32: np.float32,
                                                           DType.INT32: np.int32}[dt])
        return from_device_bytes(raw, dt).reshape(shape)

    def write(self, ptr: int, dt: DType, a: np.ndarray) -> None:
        b = to_device_bytes(a.reshape(-1), dt).view(np.uint8)
        self.view(ptr, "uint8", b.size)[:] = b

    def _kda_reference(self, kernel: str, args: tuple) -> None:
        names = kda_device.TENSORS
        ptr = {n: v for n, (_, v) in zip(names, args)}
        T, H, HV, K, V = (v for _, v in args[len(names):len(names) + 5])
        scale, lb, gate, beta_act, l2, vf = (v for _, v in args[len(names) + 5:])
        xs, gs, ss = (DType.parse({"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[s]) for s in kernel.split("_")[2:])
        N = self.state["grid"][2]
        B = 1 if ptr["cu_seqlens"] else N
        shapes = {"q": ((B, T, H, K), xs), "k": ((B, T, H, K), xs), "v": ((B, T, HV, V), xs), "g": ((B, T, HV, K), gs),
                  "beta": ((B, T, HV), xs), "A_log": ((HV,), FP32), "dt_bias": ((HV, K), FP32),
                  "initial_state": ((N, HV, K, V), ss), "cu_seqlens": ((N + 1,), DType.INT32)}
        inputs = {n: self.read(ptr[n], dt, shape) for n, (shape, dt) in shapes.items() if ptr[n]}
        scal = {"scale": scale, "lower_bound": lb, "gate": gate, "beta_act": beta_act, "qk_l2norm": l2, "v_first": vf}
        out = SPEC.reference(inputs, scal)
        for name in ("o", "final_state"):
            if ptr[f"ref:{name}"]:
                self.view(ptr[f"ref:{name}"], "float64", out[name].size)[:] = out[name].reshape(-1)


def emulated_kernel(c0: Cell, p: dict, bug: str = ""):
    """The template as a fake kernel: reads its bound buffers, runs `emulate` for the launched cell
    (N from the grid, T, H, HV from the args; K, V, dtypes, variant from c0), writes o and the state."""
    def run(dev: KdaFakeDevice, args: tuple) -> None:
        (_, pq), (_, pk), (_, pv), (_, pg), (_, pb), (_, ph0), (_, po), (_, pht), (_, T), (_, H), (_, HV), (_, scale), (_, pcu) = args
        N = dev.state["grid"][2]
        B = 1 if pcu else N
        assert dev.state["grid"] == (c0.dim("V") // p["v_tile"], HV, N)
        c = cell(c0.dtype("x"), B, T, H, c0.dim("K"), c0.dim("V"), n=N, hv=HV, g=c0.dtype("g"), state=c0.dtype("state"),
                 variant=variant_of(c0))
        x, K, V = c.dtype("x"), c.dim("K"), c.dim("V")
        inputs = {"q": dev.read(pq, x, (B, T, H, K)), "k": dev.read(pk, x, (B, T, H, K)),
                  "v": dev.read(pv, x, (B, T, HV, V)), "g": dev.read(pg, c.dtype("g"), (B, T, HV, K)),
                  "beta": dev.read(pb, x, (B, T, HV)), "initial_state": dev.read(ph0, c.dtype("state"), (N, HV, K, V))}
        if pcu:
            inputs["cu_seqlens"] = dev.read(pcu, DType.INT32, (N + 1,))
        if bug == "no_decay":
            inputs["g"] = np.zeros_like(inputs["g"])
        out = emulate(inputs, {"scale": scale}, c, p)
        if bug == "peek_ahead":  # each token's o takes a trace of the next token's v, 2e-3 of o's size where v is
            # as large as at token 0 (always before the causal check's cut): inside the tolerance on every fill
            o, v = out["o"], inputs["v"]
            o[:, :-1] += 2e-3 * np.sqrt(np.mean(o * o)) * v[:, 1:] / np.sqrt(np.mean(v[:, :1] ** 2))
        dev.write(po, x, out["o"])
        dev.write(pht, c.dtype("state"), out["final_state"])
        dev.clock += SPEC.bytes_moved(c) / 3e6  # an honest kernel's time at 3 TB/s
    return run


@pytest.mark.parametrize("bug", ["", "no_decay"])
def test_the_gate_runs_kda_jobs_end_to_end_on_the_fake_device(bug: str):
    """make_job's kda job (plan args bound, optional tensors left out, fills with transforms, gate cells)
    through the real Gate, rounds A to C, with the emulated template: OK, and WRONG_ANSWER with a bug."""
    from evo.measure.evaluate import make_job
    from evo.measure.evaluators import gate_cells_for
    from evo.measure.jobs import Timing

    c = cell(BF, 4, 1, 2, 32, 32)
    p = TDEF.default_params() | {"v_tile": 16, "vec": 2, "k_lanes": 4}
    g = Genome.make("kda", "recurrent", TDEF.source_hash, p)
    gates = gate_cells_for(SPEC, TDEF, g, c, ARCH)
    assert {(x.dim("B"), x.dim("T")) for x in gates} >= {(1, 1), (3, 1), (2, 3)}
    build = compile_point(c, p)
    job = make_job(SPEC, TDEF, g, build, c, ARCH, seed=3, timing=Timing(min_samples=100, max_samples=100, warmup=2),
                   baseline=False, gate_cells=gates)
    assert set(job.left_out) == {"A_log", "dt_bias", "cu_seqlens"}
    assert [(a[0], a[1]) for a in job.launches[0].args][-5:] == [("i32", 1), ("i32", 2), ("i32", 2), ("f32", 32 ** -0.5),
                                                                  ("ptr", 0)]
    res = gate_on_fake(KdaFakeDevice({"kda_recurrent": emulated_kernel(c, p, bug)}), job, g, c, build, bug)
    if not bug:
        assert len(res.times_us) >= 100 and any("perturbed" in w for w, _ in res.checks)


def test_the_gate_runs_a_varlen_kda_job_on_the_fake_device():
    """A varlen cell: the plan binds cu_seqlens (the last arg), the gate fills uneven lengths, and the
    emulated template, a CTA per sequence over cu[n] .. cu[n + 1] - 1, passes."""
    from evo.measure.evaluate import make_job
    from evo.measure.jobs import Timing

    c = cell(BF, 1, 9, 2, 32, 32, n=3)
    p = TDEF.default_params() | {"v_tile": 16, "vec": 2, "k_lanes": 4}
    g = Genome.make("kda", "recurrent", TDEF.source_hash, p)
    build = compile_point(c, p)
    assert build.status.ok and build.spill_stores == 0, build.error
    job = make_job(SPEC, TDEF, g, build, c, ARCH, seed=3, timing=Timing(min_samples=30, max_samples=30, warmup=2),
                   baseline=False, gate_cells=[])
    assert set(job.left_out) == {"A_log", "dt_bias"}
    assert job.launches[0].args[-1] == ("buf", "cu_seqlens") and job.launches[0].grid[2] == 3
    gate_on_fake(KdaFakeDevice({"kda_recurrent": emulated_kernel(c, p)}), job, g, c, build, None)


def test_a_kernel_whose_outputs_read_later_tokens_fails_the_causal_check():
    """o at token t takes a trace of token t + 1's v (2e-3 of o's size: inside the tolerance on every kind): every
    element-wise check passes, but where the causal check gives a set another set's tokens before a drawn position
    and fresh ones after it, o before the position moves, and the job is WRONG_ANSWER; the honest template's o
    before the position is the other set's bit for bit."""
    from evo.core.status import Status
    from evo.measure.evaluate import make_job
    from evo.measure.gate import Gate as GateRun, failed
    from evo.measure.jobs import Timing
    from evo.measure.verify import judge

    c = cell(BF, 2, 9, 2, 32, 32)
    p = TDEF.default_params() | {"v_tile": 16, "vec": 2, "k_lanes": 4}
    g = Genome.make("kda", "recurrent", TDEF.source_hash, p)
    build = compile_point(c, p)
    job = make_job(SPEC, TDEF, g, build, c, ARCH, seed=3, timing=Timing(min_samples=10, max_samples=10, warmup=1),
                   baseline=False, gate_cells=[])
    assert dict(job.causal) == {"q": 1, "k": 1, "v": 1, "g": 1, "beta": 1, "o": 1}
    for bug, want in (("peek_ahead", Status.WRONG_ANSWER), ("", Status.OK)):
        dev = KdaFakeDevice({"kda_recurrent": emulated_kernel(c, p, bug)})
        res = GateRun(dev, job, "cand", "ref", kda_device, random.Random(0), (("gpu", "fake"),), dev.ceiling_gbps).run()
        out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
        assert out.status is want, out
        assert not [w for w, cs in res.checks if any(failed(x, dict(job.tolerances)[x.output][2]) for x in cs)]
        assert any("fresh ones from it on" in w for w, _ in res.checks)
        assert ("o before position" in out.error and "changed when only inputs from it on changed" in out.error) == \
            bool(bug), out.error

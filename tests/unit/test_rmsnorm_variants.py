"""RMSNorm forward's variants: residual with residual_out (prenorm), bias, store_rstd,
out_dtype, an fp32 weight with 16-bit x. The reference against independent formulas, the plain op
unchanged, the residual template built with real NVRTC and its arithmetic emulated in numpy against the
op's tolerances, the device reference's launches and source, and the residual experiment."""

from __future__ import annotations

import math
import random
import tomllib
from pathlib import Path

import numpy as np
import pytest

from evo.build.nvrtc import BuildResult, compile_one, include_dir, prepare
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.evaluate import make_job
from evo.measure.evaluators import gate_cells_for
from evo.measure.gate import Gate
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.search.space import repair
from evo.templates.template import load_templates
from evo.core import contract
from ops.rmsnorm import device
from ops.rmsnorm.spec import (
    VARIANT_DIMS,
    FILLS,
    SPEC,
    TOLERANCES,
    VARIANT_SPEC,
    cell,
    edge_cells,
    gate_cells,
    matrix,
    matrix_bias_rstd,
    matrix_residual,
    out_dtype,
    residual_dtype,
    variant_edge_cells,
    variant_of,
)
from evo.core.spec import Cell, DType, Role, from_device_bytes, quantize, to_device_bytes
from tests.unit.fake_device import FakeDevice
from tests.unit.verdict import outside

ROOT = Path(__file__).resolve().parents[2]
FUSED = load_templates("rmsnorm")["cta_row_fused"]
EPS = 1e-6
KINDS = VARIANT_SPEC.gate_kinds()


def ids(c: Cell) -> str:
    return c.label().replace(" ", "-")


def fails(c: Cell, output: str, got: np.ndarray, ref: np.ndarray) -> bool:
    """The device compare's verdict: non-finite, any element outside atol/rtol, or the norm bound."""
    return outside(got, ref, VARIANT_SPEC.tolerance(c, output))


# ---- the reference ---------------------------------------------------------------------------------

def direct(x, w, eps, residual=None, bias=None):
    """Row by row with math.fsum: h = x + residual, y = h / sqrt(mean h^2 + eps) * w + bias."""
    m, n = x.shape
    y, h_all, rstd = np.empty((m, n)), np.empty((m, n)), np.empty(m)
    for i in range(m):
        h = [float(a) + (float(residual[i, j]) if residual is not None else 0.0) for j, a in enumerate(x[i])]
        r = 1.0 / math.sqrt(math.fsum(v * v for v in h) / n + eps)
        y[i] = [v * r * float(w[j]) + (float(bias[j]) if bias is not None else 0.0) for j, v in enumerate(h)]
        h_all[i], rstd[i] = h, r
    return y, h_all, rstd


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("c", variant_edge_cells(), ids=ids)
def test_reference_matches_direct_formulas(c, kind):
    ins = VARIANT_SPEC.make_inputs(c, kind, np.random.default_rng(3))
    var = variant_of(c)
    assert ("residual" in ins) == var.residual and ("bias" in ins) == var.bias
    out = VARIANT_SPEC.reference(ins, {"eps": EPS})
    y, h, rstd = direct(ins["x"], ins["w"], EPS, ins.get("residual"), ins.get("bias"))
    np.testing.assert_allclose(out["y"], y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["residual_out"], h, rtol=0, atol=0)
    np.testing.assert_allclose(out["rstd"], rstd, rtol=1e-13)
    for t in VARIANT_SPEC.outputs():
        assert out[t.name].shape == t.shape(c) and np.all(np.isfinite(out[t.name]))


def test_residual_then_norm_is_the_norm_of_the_sum_and_bias_comes_after_the_weight():
    rng = np.random.default_rng(0)
    x, r, w, b = rng.standard_normal((4, 64)), rng.standard_normal((4, 64)), rng.standard_normal(64), rng.standard_normal(64)
    fused = VARIANT_SPEC.reference({"x": x, "residual": r, "w": w, "bias": b}, {"eps": EPS})
    plain = VARIANT_SPEC.reference({"x": x + r, "w": w}, {"eps": EPS})
    np.testing.assert_array_equal(fused["residual_out"], x + r)
    np.testing.assert_allclose(fused["y"], plain["y"] + b, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(fused["rstd"], 1.0 / np.sqrt(np.mean((x + r) ** 2, axis=1) + EPS), rtol=1e-14)


def test_out_dtype_rounding_is_judged_by_the_out_dtype():
    """y stored in an fp32 out_dtype must be fp32-accurate: rounding it to x's bf16 fails; in fp32 it passes."""
    c = cell(DType.BF16, 8, 1024, out=DType.FP32)
    assert out_dtype(c) is DType.FP32 and VARIANT_SPEC.tolerance(c, "y") == TOLERANCES[DType.FP32]
    ins = VARIANT_SPEC.make_inputs(c, "normal", np.random.default_rng(1))
    ref = VARIANT_SPEC.reference(ins, {"eps": EPS})["y"]
    assert not fails(c, "y", quantize(ref, DType.FP32), ref)
    assert fails(c, "y", quantize(ref, DType.BF16), ref)
    c16 = cell(DType.FP32, 8, 1024, out=DType.BF16)  # and the other way: bf16 y from fp32 x
    assert VARIANT_SPEC.tolerance(c16, "y") == TOLERANCES[DType.BF16]
    assert not fails(c16, "y", quantize(ref, DType.BF16), ref)


def test_residual_out_and_rstd_tolerances_catch_their_shortcuts():
    c = cell(DType.BF16, 8, 1024, residual=DType.FP32, store_rstd=True)
    ins = VARIANT_SPEC.make_inputs(c, "normal", np.random.default_rng(2))
    out = VARIANT_SPEC.reference(ins, {"eps": EPS})
    assert fails(c, "residual_out", quantize(out["residual_out"], DType.BF16), out["residual_out"])  # fp32 stream kept in bf16
    assert fails(c, "residual_out", ins["x"], out["residual_out"])  # x stored instead of h
    assert fails(c, "y", VARIANT_SPEC.reference({"x": ins["x"], "w": ins["w"]}, {"eps": EPS})["y"], out["y"])  # residual dropped
    tiny = cell(DType.FP16, 8, 1024, store_rstd=True)
    ti = VARIANT_SPEC.make_inputs(tiny, "tiny", np.random.default_rng(2))
    r = VARIANT_SPEC.reference(ti, {"eps": EPS})["rstd"]
    no_eps = 1.0 / np.sqrt(np.mean(ti["x"] ** 2, axis=1))
    assert not fails(tiny, "rstd", r.astype(np.float32).astype(np.float64), r) and fails(tiny, "rstd", no_eps, r)


@pytest.mark.parametrize("kind", KINDS)
def test_a_kernel_that_drops_or_misplaces_the_bias_fails(kind):
    c = cell(DType.BF16, 8, 1024, bias=True)
    ins = VARIANT_SPEC.make_inputs(c, kind, np.random.default_rng(4))
    ref = VARIANT_SPEC.reference(ins, {"eps": EPS})["y"]
    plain = VARIANT_SPEC.reference({"x": ins["x"], "w": ins["w"]}, {"eps": EPS})["y"]
    before_weight = VARIANT_SPEC.reference({"x": ins["x"], "w": np.ones_like(ins["w"])}, {"eps": EPS})["y"]
    before_weight = (before_weight + ins["bias"]) * ins["w"]
    assert fails(c, "y", quantize(plain, DType.BF16), ref)
    assert fails(c, "y", quantize(before_weight, DType.BF16), ref)
    assert not fails(c, "y", quantize(ref, DType.BF16), ref)


# ---- the plain op is unchanged ----------------------------------------------------------------------

def old_make_inputs(c: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """make_inputs as it was before the variants (commit 3f8f0dc)."""
    m, n = c.dim("M"), c.dim("N")
    x = FILLS[kind]["x"].sample((m, n), rng)
    w = FILLS[kind]["w"].sample((n,), rng)
    return {"x": quantize(x, c.dtype("x")), "w": quantize(w, c.dtype("w"))}


@pytest.mark.parametrize("kind", KINDS)
def test_plain_cells_get_the_same_inputs_reference_tolerance_and_bytes(kind):
    for c in SPEC.edge_cells() + [cell(d, 7, n) for d in ("bf16", "fp16", "fp32") for n in (1024, 4096)]:
        for spec in (SPEC, VARIANT_SPEC):
            got = spec.make_inputs(c, kind, np.random.default_rng(9))
            want = old_make_inputs(c, kind, np.random.default_rng(9))
            assert got.keys() == want.keys() == {"x", "w"}
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
            x, w = want["x"], want["w"]
            y_old = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS) * w
            np.testing.assert_array_equal(spec.reference(got, {"eps": EPS})["y"], y_old)
            assert spec.tolerance(c, "y") == TOLERANCES[c.dtype("x")]
            m, n = c.dim("M"), c.dim("N")
            assert spec.bytes_moved(c) == 2 * m * n * c.dtype("x").nbytes + n * c.dtype("w").nbytes
            assert spec.flops(c) == 4 * m * n


def test_plain_spec_matrix_and_labels_are_todays():
    assert [t.name for t in SPEC.tensors] == ["x", "w", "y"] and SPEC.dtype_roles == ("x", "w")
    assert VARIANT_SPEC.dtype_roles == ("x", "w") and VARIANT_SPEC.matrix is SPEC.matrix
    labels = [c.label() for c in matrix()]
    want = [f"w={d},x={d} M{m}-N{n}" for d in ("bf16", "fp16", "fp32") for m in (4096, 32768)
            for n in (1024, 2048, 4096, 8192, 16384, 32768)]
    assert labels == want
    assert [g.label() for g in gate_cells(cell("bf16", 4096, 1024))] == [
        "w=bf16,x=bf16 M1-N1024", "w=bf16,x=bf16 M37-N1024", "w=bf16,x=bf16 M1059-N1024"]
    assert contract.problems(SPEC) == [] and contract.problems(VARIANT_SPEC) == []


def test_device_reference_of_a_plain_cell_is_todays_launch():
    for c in SPEC.edge_cells():
        (launch,) = device.reference(c.dims_dict(), c.dtypes_dict(), {"eps": EPS})
        kernel, grid, block, args = launch
        assert kernel == f"rmsnorm_ref_{device.SHORT[c.dtypes_dict()['x']]}_{device.SHORT[c.dtypes_dict()['w']]}"
        assert args == (("buf", "x"), ("buf", "w"), ("buf", "ref:y"), ("i32", c.dim("M")), ("i32", c.dim("N")),
                        ("f64", EPS))


# ---- the variant cells ------------------------------------------------------------------------------

def test_residual_matrix_is_13_cells_at_m_32768():
    cells = matrix_residual()
    assert len(cells) == len(set(cells)) == 13 and {c.dim("M") for c in cells} == {32768}
    same = [c for c in cells if residual_dtype(c) is c.dtype("x")]
    assert sorted((c.dtype("x").short, c.dim("N")) for c in same) == sorted(
        (d, n) for d in ("bf16", "fp16") for n in (1024, 2048, 4096, 8192, 16384, 32768))
    (f32,) = [c for c in cells if c not in same]
    assert f32.label() == "residual=fp32,w=bf16,x=bf16 M32768-N4096"
    assert not set(cells) & set(matrix())
    # bytes: x, residual, residual_out, y, w
    c = cell("bf16", 32768, 4096, residual=DType.FP32)
    assert VARIANT_SPEC.bytes_moved(c) == 32768 * 4096 * (2 + 4 + 4 + 2) + 4096 * 2


def test_train_matrix_is_the_forward_matrix_storing_rstd():
    from ops.rmsnorm.spec import matrix_train

    cells = matrix_train()
    assert VARIANT_SPEC.matrices["train"] is matrix_train
    assert [c.label() for c in cells] == [m.label() + "-store_rstd1" for m in matrix()]
    assert {variant_of(c) for c in cells} == {variant_of(cell("bf16", 1, 8, store_rstd=True))}
    c = cells[0]  # the rstd's fp32 word a row counts in the bytes
    assert VARIANT_SPEC.bytes_moved(c) == VARIANT_SPEC.bytes_moved(matrix()[0]) + 4 * c.dim("M")


def test_the_training_forward_experiment_searches_the_train_matrix_with_templates_that_store_rstd():
    """experiments/rmsnorm_train_rstd.toml: the 36 store_rstd cells, each with legal points of both templates."""
    from pathlib import Path

    from evo.core.config import load_config
    from evo.loop.pipeline import cells_for
    from tests.unit.config_checks import legal_everywhere

    c = load_config(Path(__file__).resolve().parents[2] / "experiments" / "rmsnorm_train_rstd.toml")
    cells = cells_for(c, VARIANT_SPEC)
    assert [x.label() for x in cells] == [x.label() for x in VARIANT_SPEC.matrices["train"]()]
    legal_everywhere(c, cells, tries=500)


def test_bias_rstd_matrix_covers_the_other_switches():
    cells = matrix_bias_rstd()
    assert VARIANT_SPEC.matrices["bias_rstd"] is matrix_bias_rstd and len(set(cells)) == len(cells) == 9
    assert {(c.dim("M"), c.dtype("x"), c.dtype("w")) for c in cells} == {(32768, DType.BF16, DType.BF16)}
    assert {(variant_of(c), c.dim("N")) for c in cells} == {
        (v, n) for v in (variant_of(cell("bf16", 1, 8, bias=True)), variant_of(cell("bf16", 1, 8, store_rstd=True)),
                         variant_of(cell("bf16", 1, 8, residual=True, bias=True, store_rstd=True)))
        for n in (1024, 4096, 16384)}
    assert not set(cells) & (set(matrix()) | set(matrix_residual()))
    assert contract.problems(VARIANT_SPEC) == [] and set(cells) <= set(VARIANT_SPEC.all_cells())


def test_the_op_says_which_cells_use_each_optional_tensor():
    for c in variant_edge_cells() + matrix_bias_rstd() + SPEC.edge_cells():
        var = variant_of(c)
        assert {t.name for t in VARIANT_SPEC.tensors if VARIANT_SPEC.uses(c, t.name)} == (
            {"x", "w", "y"} | ({"residual", "residual_out"} if var.residual else set())
            | ({"bias"} if var.bias else set()) | ({"rstd"} if var.store_rstd else set()))
        assert [VARIANT_SPEC.dim_value(c, d) for d in ("bias", "store_rstd")] == [int(var.bias), int(var.store_rstd)]


def test_bytes_count_only_the_tensors_a_variant_uses():
    m, n = 6, 2048
    c = cell("fp16", m, n, "fp32", bias=True, store_rstd=True, out="fp32")
    assert VARIANT_SPEC.bytes_moved(c) == m * n * (2 + 4) + n * 4 + n * 4 + m * 4
    c = cell("bf16", m, n, residual=True, bias=True)
    assert VARIANT_SPEC.bytes_moved(c) == m * n * (2 + 2 + 2 + 2) + 2 * n * 2


def test_gate_cells_keep_the_variant():
    c = cell("bf16", 32768, 4096, residual=DType.FP32, bias=True)
    for g in gate_cells(c):
        assert g.dtypes == c.dtypes and variant_of(g) == variant_of(c) and g.dim("N") == 4096


@pytest.mark.parametrize("c", variant_edge_cells(), ids=ids)
def test_device_reference_launch_names_the_variant(c):
    (launch,) = device.reference(c.dims_dict(), c.dtypes_dict(), {"eps": EPS})
    kernel, _, _, args = launch
    var = variant_of(c)
    if not (var.residual or var.bias or var.store_rstd):
        assert "variant" not in kernel and len(args) == 6  # out_dtype alone: y's values are today's
        return
    d = c.dtypes_dict()
    assert kernel == f"rmsnorm_ref_variant_{device.SHORT[d['x']]}_{device.SHORT[d['w']]}_" \
                     f"{device.SHORT[d.get('residual', d['x'])]}"
    assert args[-1] == ("i32", int(var.residual) + 2 * int(var.bias) + 4 * int(var.store_rstd))
    names = {t.name for t in VARIANT_SPEC.tensors} | {f"ref:{t.name}" for t in VARIANT_SPEC.outputs()}
    assert {v for k, v in args if k == "buf"} <= names


def test_device_reference_source_compiles_for_sm90a():
    """Every kernel device.reference can name is in the compiled cubin (NVRTC, no GPU needed)."""
    from cuda.core import Program, ProgramOptions

    src = device.SOURCE.read_text()
    opts = ProgramOptions(arch="sm_90a", std="c++17", include_path=[include_dir()])
    cubin = Program(src, code_type="c++", options=opts).compile("cubin").code
    kernels = {launch[0] for c in [*SPEC.edge_cells(), *variant_edge_cells(), *matrix_residual()]
               for launch in device.reference(c.dims_dict(), c.dtypes_dict(), {"eps": EPS})}
    kernels |= {f"rmsnorm_ref_variant_{x}_{w}_{r}" for x, w, r in device.VARIANT_KERNELS}
    for k in kernels:
        assert k.encode() in cubin, k


# ---- the fused template: every variant ---------------------------------------------------------------

def repaired(c: Cell) -> dict:
    p = repair(FUSED, FUSED.default_params(), random.Random(0), 90, [c.dtypes_dict()], [c.dims_dict()])
    assert p is not None, f"no legal cta_row_fused point for {c.label()}"
    return p


def build(c: Cell, params: dict):
    g = Genome.make("rmsnorm", FUSED.name, FUSED.source_hash, params)
    return compile_one(prepare(FUSED, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))


PLAIN_EDGES = [c for c in edge_cells() if c.dtype("x") is DType.BF16] + [cell("fp16", 19, 2056, "fp32")]
BUILT = list(dict.fromkeys(matrix_residual() + matrix_bias_rstd() + variant_edge_cells() + PLAIN_EDGES))


@pytest.mark.parametrize("c", BUILT, ids=ids)
def test_fused_template_builds_without_spills(c):
    params = repaired(c)
    r = build(c, params)
    assert r.status is Status.OK, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF" and r.spill_stores == 0 and r.spill_loads == 0
    assert dict(r.resources)["rmsnorm_cta_row_fused"].regs <= min(255, 65536 // (params["threads"] * params["min_blocks"]))


def test_fused_template_builds_at_its_defaults_where_they_are_legal():
    for c in (cell("bf16", 32768, 4096, residual=True), cell("bf16", 32768, 4096, bias=True, store_rstd=True)):
        assert FUSED.violations(FUSED.default_params(), 90, c.dtypes_dict(), c.dims_dict()) == []
        r = build(c, FUSED.default_params())
        assert r.status is Status.OK and r.spill_stores == 0, r.error + r.log


def test_fused_template_renders_each_variant_and_bakes_in_bias_and_store_rstd():
    """The specialized dims are N, bias and store_rstd, at 0 where the cell lacks them; the rendered code
    touches only the tensors of the cell's variant."""
    assert FUSED.specialize == ("N", "bias", "store_rstd")
    p = FUSED.default_params()
    g = Genome.make("rmsnorm", FUSED.name, FUSED.source_hash, p)
    for c, touches in [(cell("bf16", 64, 4096), set()), (cell("bf16", 64, 4096, residual=True), {"residual"}),
                       (cell("bf16", 64, 4096, bias=True), {"bias"}), (cell("bf16", 64, 4096, store_rstd=True), {"rstd"}),
                       (cell("bf16", 64, 4096, residual="fp32", bias=True, store_rstd=True), {"residual", "bias", "rstd"})]:
        bi = prepare(FUSED, g, "sm_90a", c.dtypes_dict(), c.dims_dict())
        var = variant_of(c)
        assert dict(bi.consts) == {"N": 4096, "bias": int(var.bias), "store_rstd": int(var.store_rstd)}
        body = bi.source.split("float* __restrict__ rstd, int M, float eps) {", 1)[1]
        used = {t for t, use in [("residual", "residual + base"), ("bias", "bias + (long long)"), ("rstd", "rstd[blockIdx.x]")]
                if use in body}
        assert used == touches, c.label()
        assert ("residual_out + base" in body) == var.residual


def test_plain_cells_keep_their_build_keys_under_every_other_template():
    """The dims a template specializes on are the cell's own wherever the cell has them, a variant switch it
    specializes on (the plain templates' store_rstd) its default 0 on a plain cell: every template but
    cta_row_fused keys a plain cell by its own dims and those switches off."""
    for name, t in load_templates("rmsnorm").items():
        if name == FUSED.name:
            continue
        g = Genome.make("rmsnorm", name, t.source_hash, t.default_params())
        for c in matrix()[:12] + edge_cells():
            bi = prepare(t, g, "sm_90a", c.dtypes_dict(), c.dims_dict())
            want = {d: 0 for d in t.specialize if d in VARIANT_DIMS} | {d: c.dim(d) for d in t.specialize
                                                                         if d not in VARIANT_DIMS}
            assert bi.consts == tuple(sorted(want.items())), (name, c.label())
    plain = cell("bf16", 64, 4096)
    assert FUSED.consts(plain.dims_dict()) == {"N": 4096, "bias": 0, "store_rstd": 0}
    assert FUSED.consts(cell("bf16", 64, 4096, bias=True).dims_dict())["bias"] == 1


PLAIN_STORING = ("cta_row_async", "cta_row_l2")  # long-row winners that store rstd when asked (cta_row: its text is
# what the replay fixtures and committed tables were recorded with, so it stays as it is)


@pytest.mark.parametrize("name", PLAIN_STORING)
def test_a_plain_template_stores_rstd_only_when_the_cell_asks_and_builds_either_way(name):
    """store_rstd is a specialized switch of the plain winners' templates: a plain cell renders without the store
    (rstd? bound null), a store_rstd cell writes each row's rstd once from thread 0; both build for sm_90a without
    spills (NVRTC)."""
    t = load_templates("rmsnorm")[name]
    assert "store_rstd" in t.specialize and "rstd?" in t.launches[0].args
    for c in (cell("bf16", 64, 4096), cell("bf16", 64, 4096, store_rstd=True)):
        p = repair(t, t.default_params(), random.Random(0), 90, [c.dtypes_dict()], [c.dims_dict()])
        g = Genome.make("rmsnorm", name, t.source_hash, p)
        bi = prepare(t, g, "sm_90a", c.dtypes_dict(), c.dims_dict())
        stored = variant_of(c).store_rstd
        assert dict(bi.consts)["store_rstd"] == int(stored)
        assert ("rstd_out[blockIdx.x] = rstd;" in bi.source) == stored, c.label()
        r = compile_one(bi)
        assert r.status is Status.OK and r.spill_stores == 0, r.error + r.log


def test_gate_cells_of_a_variant_cell_share_its_specialized_dims():
    """gate_cells_for compares the specialized dims with the op's default: the plain edge cells (no bias
    dim) join a plain cell's gate, never a bias cell's (another build)."""
    p = FUSED.default_params() | {"threads": 128, "vec": 8}
    g = Genome.make("rmsnorm", FUSED.name, FUSED.source_hash, p)
    plain, biased = cell("bf16", 4096, 2048, "fp32"), cell("bf16", 4096, 2048, "fp32", bias=True)
    assert cell("bf16", 19, 2048, "fp32") in gate_cells_for(VARIANT_SPEC, FUSED, g, plain, 90)
    gates = gate_cells_for(VARIANT_SPEC, FUSED, g, biased, 90)
    assert gates and all(variant_of(x) == variant_of(biased) for x in gates)


VARIANTS = [cell("bf16", 4096, 2048), cell("bf16", 4096, 2048, residual="fp32"), cell("bf16", 4096, 2048, bias=True),
            cell("fp16", 4096, 2048, store_rstd=True, out="fp32"),
            cell("bf16", 4096, 2048, residual=True, bias=True, store_rstd=True)]


@pytest.mark.parametrize("c", VARIANTS, ids=ids)
def test_fused_launch_binds_the_variants_tensors_and_nulls_the_others(c):
    params = repaired(c)
    g = Genome.make("rmsnorm", FUSED.name, FUSED.source_hash, params)
    job = make_job(VARIANT_SPEC, FUSED, g, BuildResult("k", Status.OK), c, 90, seed=1, timing=None, baseline=False,
                   gate_cells=gate_cells(c))
    used = {t.name for t in VARIANT_SPEC.tensors if VARIANT_SPEC.uses(c, t.name)}
    assert {b.name: b.dtype for b in job.buffers} == {t.name: t.resolve_dtype(c).value for t in VARIANT_SPEC.tensors
                                                      if t.name in used}
    assert set(job.left_out) == {t.name for t in VARIANT_SPEC.tensors} - used
    assert dict(job.tolerances).keys() == {t.name for t in VARIANT_SPEC.outputs()} & used
    assert all(dict(specs).keys() == {t.name for t in VARIANT_SPEC.inputs()} & used for _, specs in job.fills)
    assert job.bytes_moved == VARIANT_SPEC.bytes_moved(c)
    assert [gc.label for gc in job.gate] == [x.label() for x in gate_cells(c)]
    (launch,) = job.launches
    names = ["x", "residual", "w", "bias", "y", "residual_out", "rstd"]
    assert launch.args[:7] == tuple(("buf", n) if n in used else ("ptr", 0) for n in names)
    for gc in job.gate:
        assert {b.name for b in gc.buffers} == used and gc.launches[0].args[:7] == launch.args[:7]


# ---- the template's arithmetic, emulated ------------------------------------------------------------

def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def emulate(c: Cell, params: dict, ins: dict, eps: float) -> dict[str, np.ndarray]:
    """cta_row_fused's fp32 arithmetic in its order: h = x (+ r); per thread ss = fma(h, h, ss) over its
    vectors t, t + threads, ...; a butterfly warp sum; the warps' partials summed in order; rstd =
    rsqrtf(total * (1/N) + eps); y = fma(h * rstd, w, bias) (or (h * rstd) * w) rounded to y's dtype,
    residual_out = h rounded, rstd as computed. Only the outputs of the cell's variant."""
    m, n = c.dim("M"), c.dim("N")
    var = variant_of(c)
    threads, vec = params["threads"], params["vec"]
    nvec = n // vec
    items = -(-nvec // threads)
    h = f32(f32(ins["x"]) + f32(ins["residual"])) if var.residual else f32(ins["x"])
    hv = np.zeros((m, items * threads, vec), dtype=np.float32)
    hv[:, :nvec] = h.reshape(m, nvec, vec)
    hv = hv.reshape(m, items, threads, vec)
    ss = np.zeros((m, threads), dtype=np.float32)
    for i in range(items):
        for j in range(vec):
            e = hv[:, i, :, j].astype(np.float64)
            ss = f32(e * e + ss.astype(np.float64))  # one rounding: an fma
    lanes = ss.reshape(m, threads // 32, 32)
    for o in (16, 8, 4, 2, 1):
        lanes = f32(lanes + lanes[..., np.arange(32) ^ o])
    total = np.zeros(m, dtype=np.float32)
    for wi in range(threads // 32):
        total = f32(total + lanes[:, wi, 0])
    inv_n = np.float32(1.0) / np.float32(n)
    rstd = f32(1.0 / np.sqrt(f32(total.astype(np.float64) * float(inv_n) + float(np.float32(eps))).astype(np.float64)))
    hr = f32(h * rstd[:, None]).astype(np.float64)
    w = f32(ins["w"]).astype(np.float64)
    y = f32(hr * w + f32(ins["bias"]).astype(np.float64)) if var.bias else f32(hr * w)
    out = {"y": quantize(y, out_dtype(c))}
    if var.residual:
        out["residual_out"] = quantize(h, residual_dtype(c))
    if var.store_rstd:
        out["rstd"] = rstd.astype(np.float64)
    return out


EMULATED = list(dict.fromkeys([Cell.make(c.dtypes_dict(), c.dims_dict() | {"M": 3})
                               for c in matrix_residual() + matrix_bias_rstd()] + variant_edge_cells() + PLAIN_EDGES))


@pytest.mark.parametrize("c", EMULATED, ids=ids)
def test_emulated_template_is_within_tolerance_on_every_kind(c):
    params = repaired(c)
    used = {t.name for t in VARIANT_SPEC.outputs() if VARIANT_SPEC.uses(c, t.name)}
    for kind in KINDS:
        ins = VARIANT_SPEC.make_inputs(c, kind, np.random.default_rng(5))
        ref = VARIANT_SPEC.reference(ins, {"eps": EPS})
        got = emulate(c, params, ins, EPS)
        assert got.keys() == used
        for name in used:
            assert not fails(c, name, got[name], ref[name]), (kind, name)


def test_emulation_catches_a_norm_of_the_rounded_residual_out_only_where_it_matters():
    """The emulation is a real check: normalizing residual_out (rounded to bf16) instead of the fp32 h
    stays inside bf16's y tolerance, while dropping the residual from the norm does not."""
    c = cell("bf16", 3, 4096, residual=True)
    params = repaired(c)
    ins = VARIANT_SPEC.make_inputs(c, "normal", np.random.default_rng(6))
    ref = VARIANT_SPEC.reference(ins, {"eps": EPS})
    rounded = dict(ins, x=quantize(ins["x"] + ins["residual"], DType.BF16), residual=np.zeros_like(ins["x"]))
    assert not fails(c, "y", emulate(c, params, rounded, EPS)["y"], ref["y"])
    dropped = dict(ins, residual=np.zeros_like(ins["x"]))
    assert fails(c, "y", emulate(c, params, dropped, EPS)["y"], ref["y"])


# ---- the real gate on the numpy device: make_job's job for the template, the emulated kernel ----------

NP_OF = {DType.BF16: np.uint16, DType.FP16: np.float16, DType.FP32: np.float32}


class RmsFakeDevice(FakeDevice):
    """The numpy device with RMSNorm's float64 reference (plain and variant kernels) computed by the op's
    reference from the bound buffers; the cell's dtypes are given, M comes from the launch."""

    def __init__(self, kernels, c0: Cell) -> None:
        super().__init__(kernels, baseline_us=None)
        self.c0 = c0

    def launch(self, obj, kernel, grid, block, smem, args, side=False, pdl=False):
        if obj == "ref" and self._capturing is None:
            return self._reference(args)
        return super().launch(obj, kernel, grid, block, smem, args, side, pdl)

    def read(self, ptr: int, dt: DType, shape: tuple) -> np.ndarray:
        n = int(np.prod(shape))
        return from_device_bytes(self.view(ptr, "uint8", n * dt.nbytes).view(NP_OF[dt]), dt).reshape(shape)

    def write(self, ptr: int, dt: DType, a: np.ndarray) -> None:
        b = to_device_bytes(a.reshape(-1), dt).view(np.uint8)
        self.view(ptr, "uint8", b.size)[:] = b

    def _reference(self, args: tuple) -> None:
        names = ("x", "residual", "w", "bias", "ref:y", "ref:residual_out", "ref:rstd")
        if len(args) == 6:  # the plain kernel: x, w, ref:y, M, N, eps
            names = ("x", "w", "ref:y")
        ptr = {k: v for k, (_, v) in zip(names, args)}
        m, n, eps = (v for _, v in args[len(names):len(names) + 3])
        c = Cell.make(self.c0.dtypes_dict(), self.c0.dims_dict() | {"M": m})
        ins = {t.name: self.read(ptr[t.name], t.resolve_dtype(c), t.shape(c)) for t in VARIANT_SPEC.inputs()
               if ptr.get(t.name)}
        out = VARIANT_SPEC.reference(ins, {"eps": eps})
        for t in VARIANT_SPEC.outputs():
            if ptr.get(f"ref:{t.name}"):
                self.view(ptr[f"ref:{t.name}"], "float64", out[t.name].size)[:] = out[t.name].reshape(-1)


def fused_kernel(c0: Cell, params: dict, bug: str = ""):
    """cta_row_fused as a fake kernel: its args in the header's order (null pointers for the tensors the
    cell's variant does not use), `emulate` for the launched M; `bug` drops the bias, or stores an rstd
    without eps or of x alone."""
    def run(dev: RmsFakeDevice, args: tuple) -> None:
        (_, px), (_, pr), (_, pw), (_, pb), (_, py), (_, pro), (_, prs), (_, m), (_, eps) = args
        c = Cell.make(c0.dtypes_dict(), c0.dims_dict() | {"M": m})
        shapes = {t.name: (t.resolve_dtype(c), t.shape(c)) for t in VARIANT_SPEC.tensors}
        ins = {k: dev.read(p, *shapes[k]) for k, p in [("x", px), ("residual", pr), ("w", pw), ("bias", pb)] if p}
        if bug == "no_bias":
            ins["bias"] = np.zeros_like(ins["bias"])
        out = emulate(c, params, ins, eps)
        if bug == "rstd_no_eps":  # inf on an all-zero row
            with np.errstate(divide="ignore", invalid="ignore"):
                out["rstd"] = emulate(c, params, ins, 0.0)["rstd"]
        if bug == "rstd_of_x":  # the norm of x, not of h = x + residual
            plain = Cell.make({k: v for k, v in c.dtypes_dict().items() if k != "residual"}, c.dims_dict())
            out["rstd"] = emulate(plain, params, {"x": ins["x"], "w": ins["w"]}, eps)["rstd"]
        for k, p in [("y", py), ("residual_out", pro), ("rstd", prs)]:
            assert (k in out) == bool(p), k  # the plan binds exactly the variant's outputs
            if p:
                dev.write(p, shapes[k][0], out[k])
        dev.clock += VARIANT_SPEC.bytes_moved(c) / 3e6  # an honest kernel's time at 3 TB/s
    return run


@pytest.mark.parametrize("c, bug", [
    (cell("bf16", 8, 1024), ""),
    (cell("bf16", 8, 1024, residual=True, bias=True, store_rstd=True), ""),
    (cell("fp16", 8, 2048, "fp32", bias=True, out="fp32"), ""),
    (cell("bf16", 8, 1024, bias=True), "no_bias"),
    (cell("bf16", 8, 1024, residual=True, bias=True, store_rstd=True), "no_bias"),
    (cell("fp16", 8, 1024, store_rstd=True), "rstd_no_eps"),
    (cell("bf16", 8, 1024, residual="fp32", store_rstd=True), "rstd_of_x"),
], ids=lambda v: ids(v) if isinstance(v, Cell) else (v or "honest"))
def test_the_gate_runs_the_fused_template_on_the_fake_device(c, bug):
    """make_job's job (conditional args bound or null, the variant's fills and checks, gate cells) through
    the real Gate with the emulated template: OK; WRONG_ANSWER when it drops the bias or writes a wrong
    rstd."""
    params = repaired(c)
    g = Genome.make("rmsnorm", FUSED.name, FUSED.source_hash, params)
    gates = gate_cells_for(VARIANT_SPEC, FUSED, g, c, 90)
    job = make_job(VARIANT_SPEC, FUSED, g, BuildResult("k", Status.OK), c, 90, seed=3,
                   timing=Timing(min_samples=20, max_samples=20, warmup=2), baseline=False, gate_cells=gates)
    dev = RmsFakeDevice({"rmsnorm_cta_row_fused": fused_kernel(c, params, bug)}, c)
    res = Gate(dev, job, "cand", "ref", device, random.Random(0), (("gpu", "fake"),), dev.ceiling_gbps).run()
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, "k")
    if bug:
        assert out.status is Status.WRONG_ANSWER, out
    else:
        assert out.status is Status.OK, (out.status, out.error, res.checks[-2:], res.input_faults)
        assert len(res.times_us) >= 20 and any("perturbed" in w for w, _ in res.checks)


# ---- the experiment ---------------------------------------------------------------------------------

def test_residual_experiment_searches_the_fused_template_on_the_residual_matrix():
    doc = tomllib.loads((ROOT / "experiments" / "rmsnorm_residual_h200.toml").read_text())
    assert doc["run"]["op"] == "rmsnorm" and doc["run"]["templates"] == ["cta_row_fused"]
    assert doc["cells"]["matrix"] == "residual"
    space = FUSED.restrict(doc["search"]["space"]["cta_row_fused"])
    for c in matrix_residual() + matrix_bias_rstd():  # the same search serves the "bias_rstd" matrix
        legal = repair(space, space.default_params(), random.Random(0), 90, [c.dtypes_dict()], [c.dims_dict()])
        assert legal is not None, c.label()


def test_variant_spec_declares_the_variant_tensors_optional():
    opt = {t.name: t.role for t in VARIANT_SPEC.tensors if t.optional}
    assert opt == {"residual": Role.IN, "bias": Role.IN, "residual_out": Role.OUT, "rstd": Role.OUT}
    assert VARIANT_SPEC.tensor("rstd").resolve_dtype(cell("bf16", 2, 8, store_rstd=True)) is DType.FP32

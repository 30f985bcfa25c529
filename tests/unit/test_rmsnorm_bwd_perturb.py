"""RMSNorm backward through the real gate on the numpy device, with a fake kernel that does cluster_rows'
fp32 arithmetic in its order: the gate's round C must pass it on every dtype, and still fail planted bugs.

dw's atol is element-wise in units of the column's rms term (the op's SCALED output, 'scale:dw'): a right
fp32 sum of terms of ~400 that cancel misses the unit-term atol by >10x (test_dw_rounding_grows_...), as
nine correct candidates of an H100 fp32 run did on the perturbed "large" set.

Why rstd is never moved far (ops/rmsnorm_bwd/spec.py, FillSpec.perturb): moved to |r| ~ 20 while x
stays put, a row's term r * xhat * mean(g * xhat) grows as r^3, the exact dx leaves fp16's range and a
right fp32 kernel misses the element-wise atol where its terms cancel (test_moving_rstd_far_...).
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.gate import PERTURB_EVERY, Gate
from evo.measure.jobs import BufferDecl, EvalJob, LaunchJob, Timing
from evo.measure.verify import judge
from ops.rmsnorm_bwd import device as bwd_device
from ops.rmsnorm_bwd.reference import rmsnorm_bwd
from ops.rmsnorm_bwd.spec import FILLS, SPEC, cell, make_inputs
from evo.core.spec import DType, from_device_bytes, quantize, to_device_bytes
from tests.unit.fake_device import FakeDevice

F32 = np.float32
NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
G = Genome.make("rmsnorm_bwd", "fake", "", {})


def read(dev: FakeDevice, ptr: int, dtype: str, n: int) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has no bf16: the bit patterns, widened
        return from_device_bytes(dev.view(ptr, "uint8", 2 * n).view(np.uint16), DType.BF16)
    return dev.view(ptr, dtype, n).astype(np.float64)


def write(dev: FakeDevice, ptr: int, dtype: str, v: np.ndarray) -> None:
    raw = to_device_bytes(np.asarray(v, np.float64).reshape(-1), DType(dtype)).view(np.uint8)
    dev.view(ptr, "uint8", raw.size)[:] = raw


class BwdDevice(FakeDevice):
    """The fake device with rmsnorm_bwd's float64 references (the op's device hooks name them)."""

    def launch(self, obj, kernel, grid, block, smem, args, side=False, pdl=False):
        if obj != "ref" or self._capturing is not None:
            return super().launch(obj, kernel, grid, block, smem, args, side, pdl)
        (_, px), (_, pw), (_, pd), (_, pr), (_, po), *scale, (_, m), (_, n) = args
        xd, wd = (NAMES[s] for s in kernel.split("_")[-2:])
        ins = {"x": read(self, px, xd, m * n).reshape(m, n), "w": read(self, pw, wd, n),
               "dout": read(self, pd, xd, m * n).reshape(m, n), "rstd": read(self, pr, "float32", m)}
        out = rmsnorm_bwd(ins, {})
        self.view(po, "float64", m * n if "_dx_" in kernel else n)[:] = out["dx" if "_dx_" in kernel else "dw"].reshape(-1)
        if scale:  # the output's element-wise error scale beside it (the op's SCALED outputs)
            name = "dx" if "_dx_" in kernel else "dw"
            self.view(scale[0][1], "float64", m * n if name == "dx" else n)[:] = \
                bwd_device.error_scales(ins)[name].reshape(-1)


def cluster_rows(x, w, dy, r, threads=256, vec=4, groups=264, bug=""):
    """dx and dw as templates/rmsnorm_bwd/cluster_rows.cu.j2 (cluster 1) computes them, in fp32: thread t
    owns vectors t, t + threads, ...; its dot is a chain of fma(g * w, x, dot); a butterfly warp sum; the
    warps summed in order; a = r * r * r * s * (1 / N); dx = fma(-a, x, r * g * w); dw from one fp32
    partial row per row group, the partials summed by column."""
    m, n = x.shape
    x, w, dy, r = x.astype(F32), w.astype(F32), dy.astype(F32), r.astype(F32)
    nvec = n // vec
    items = -(-nvec // threads)
    pad = items * threads * vec - n  # a thread past the slice owns nothing: its terms are zero
    gw = np.pad((dy * w).astype(F32), ((0, 0), (0, pad))).reshape(m, items, threads, vec)
    xp = np.pad(x, ((0, 0), (0, pad))).reshape(m, items, threads, vec)
    dot = np.zeros((m, threads), F32)
    for i in range(items):
        for j in range(vec):
            dot = (gw[:, i, :, j].astype(np.float64) * xp[:, i, :, j] + dot).astype(F32)
    d = dot.reshape(m, threads // 32, 32)
    for o in (16, 8, 4, 2, 1):
        d = (d + d[:, :, np.arange(32) ^ o]).astype(F32)
    s = np.zeros(m, F32)
    for k in range(threads // 32):
        s = (s + d[:, k, 0]).astype(F32)
    rr = r
    if bug == "rstd_from_x":  # recomputes rstd from x instead of reading it
        rr = (1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + 1e-6)).astype(F32)
    cube = rr * rr if bug == "r_squared" else rr * rr * rr
    a = ((cube.astype(F32) * s).astype(F32) * F32(1.0 / n)).astype(F32)[:, None]
    rgw = ((rr[:, None] * dy).astype(F32) * w).astype(F32)
    dx = rgw if bug == "dropped_term" else (rgw.astype(np.float64) - a.astype(np.float64) * x).astype(F32)
    acc = np.zeros((min(m, groups), n), F32)
    rows = range(m - 1) if bug == "dw_short_row" else range(m)
    for row in rows:
        acc[row % groups] = (acc[row % groups] + ((dy[row] * x[row]).astype(F32) * rr[row]).astype(F32)).astype(F32)
    dw = np.zeros(n, F32)
    for g in range(acc.shape[0]):
        dw = (dw + acc[g]).astype(np.float16 if bug == "dw_fp16_sum" else F32)  # the bug: partials summed in fp16
    return dx.astype(np.float64), dw.astype(np.float64)


def fake_kernel(bug: str = "", dw_off: float = 0.0):
    def k(dev, args):
        (_, px), (_, pw), (_, pd), (_, pr), (_, po), (_, pdw), (_, m), (_, n), (_, xd), (_, wd) = args
        x = read(dev, px, xd, m * n).reshape(m, n)
        dy = read(dev, pd, xd, m * n).reshape(m, n)
        dx, dw = cluster_rows(x, read(dev, pw, wd, n), dy, read(dev, pr, "float32", m), bug=bug)
        with np.errstate(over="ignore"):
            if bug == "missing_row":  # the last row is never written: it keeps the poison
                write(dev, po, xd, dx[:-1])
            else:
                write(dev, po, xd, dx)
            dw[5] += dw_off  # one element of dw off by this much
            write(dev, pdw, wd, dw)
        dev.clock += 3 * m * n * DType(xd).nbytes / 3000.0 / 1e3  # an honest kernel's time at 3 TB/s
    return k


def bwd_job(c, fills=FILLS) -> EvalJob:
    m, n = c.dim("M"), c.dim("N")
    bufs = tuple(BufferDecl(t.name, t.resolve_dtype(c).value, t.shape(c), t.role.value) for t in SPEC.tensors)
    xd, wd = c.dtype("x").value, c.dtype("w").value
    args = (("buf", "x"), ("buf", "w"), ("buf", "dout"), ("buf", "rstd"), ("buf", "dx"), ("buf", "dw"),
            ("i32", m), ("i32", n), ("str", xd), ("str", wd))
    tols = tuple((o, (t.atol, t.rtol, t.rel_norm)) for o in ("dx", "dw") for t in [SPEC.tolerance(c, o)])
    # direct timing (graph_below_us 0), few samples: round C runs on sets 0 ("normal") and 1 ("large")
    timing = Timing(min_samples=3, max_samples=3, warmup=1, graph_below_us=0.0)
    return EvalJob("bwd-job", "rmsnorm_bwd", tuple(sorted(c.dims_dict().items())), tuple(sorted(c.dtypes_dict().items())),
                   b"", (LaunchJob("cand", (m, 1, 1), (256, 1, 1), 0, args),), bufs, (), SPEC.input_kinds, tols, 11,
                   timing, False, 1, tuple((k, tuple(sorted(v.items()))) for k, v in fills.items()), SPEC.timing_kinds,
                   SPEC.bytes_moved(c))


def run(c, bug="", fills=FILLS, seed=0, dev=None, hooks=bwd_device):
    dev = dev or BwdDevice({"cand": fake_kernel(bug)}, baseline_us=None)
    res = Gate(dev, bwd_job(c, fills), "cand", "ref", hooks, random.Random(seed), (("gpu", "fake"),),
               dev.ceiling_gbps).run()
    return judge(res, {o: SPEC.tolerance(c, o).rel_norm for o in ("dx", "dw")}, G, c), res


CELLS = [cell(d, 96, 2048) for d in ("fp32", "fp16", "bf16")] + [cell("bf16", 37, 1000, "fp32")]


# fp32 M1024-N2048: the cell and seed on which the same kernel fails with rstd moved (the last test)
@pytest.mark.parametrize("c", CELLS + [cell("fp32", 1024, 2048)], ids=lambda c: c.label())
def test_cluster_rows_arithmetic_passes_every_round_with_perturbation(c):
    v, res = run(c)
    assert v.status is Status.OK, v.error
    wheres = [w for w, _ in res.checks]
    assert "perturbed set 0" in wheres and "perturbed set 1" in wheres


def test_rstd_is_the_only_input_round_c_leaves_in_place():
    for kind, specs in FILLS.items():
        assert not specs["rstd"].perturb, kind
        assert all(specs[t].perturb for t in ("x", "w", "dout")), kind


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # a poisoned row read back
@pytest.mark.parametrize("bug", ["dropped_term", "rstd_from_x", "r_squared", "missing_row", "dw_short_row"])
@pytest.mark.parametrize("c", CELLS[:3], ids=lambda c: c.label())
def test_planted_bugs_still_fail(c, bug):
    v, _ = run(c, bug)
    assert v.status is Status.WRONG_ANSWER, (bug, v.status, v.error)
    assert ("dw" if bug == "dw_short_row" else "dx") in v.error.split(" on ")[0]


def _worker_perturb(a, dtype, amount, rng):
    """evo/measure/cuda/support.cu perturb: about one element in PERTURB_EVERY becomes -old +- amount."""
    flat = a.copy().reshape(-1)
    sel = rng.random(flat.size) < 1.0 / PERTURB_EVERY
    flat[sel] = -flat[sel] + np.where(rng.random(sel.sum()) < 0.5, amount, -amount)
    return quantize(flat.reshape(a.shape), dtype)


@pytest.mark.parametrize("with_rstd", [False, True])
def test_moving_rstd_far_is_what_failed_right_kernels(with_rstd):
    """The H200 run's fp32/fp16 rejections, on the CPU: with rstd moved as the worker moves it, the exact
    dx of the normal kind passes fp16's 65504 (a right kernel writes inf: 'some unwritten or NaN') and
    the fp32 kernel's error, ~6e-8 x terms of ~1e5, passes atol + rtol * |dx| where the terms cancel
    ('some elements wrong', rel norm ~1e-7). Moving x, w and dout alone keeps both in tolerance."""
    m, n = 1024, 2048  # the failures are rare events (about 1 row in 61 moved): enough rows to see them
    out = {}
    for d in (DType.FP32, DType.FP16):
        c = cell(d, m, n)
        rng = np.random.default_rng(1)
        ins = make_inputs(c, "normal", rng)
        moved = {k: _worker_perturb(v, DType.FP32 if k == "rstd" else d, 16 * FILLS["normal"][k].magnitude(), rng)
                 if (k != "rstd" or with_rstd) else v for k, v in ins.items()}
        ref = rmsnorm_bwd(moved, {})["dx"]
        dx, _ = cluster_rows(moved["x"], moved["w"], moved["dout"], moved["rstd"])
        with np.errstate(over="ignore", invalid="ignore"):
            got = quantize(dx, d)
            t = SPEC.tolerance(c, "dx")
            err = np.abs(got - ref)
            bad = ~np.isfinite(got) | (err > t.atol + t.rtol * np.abs(ref))
        out[d] = (int(bad.sum()), int((~np.isfinite(got)).sum()), int((np.abs(ref) >= 65520).sum()),
                  float(np.sqrt(np.sum(np.where(np.isfinite(err), err, 0) ** 2) / np.sum(ref ** 2))))
    (b32, nf32, _, rel32), (b16, nf16, over16, _) = out[DType.FP32], out[DType.FP16]
    assert nf32 == 0 and rel32 < 1e-6  # fp32 right in norm either way
    if with_rstd:
        assert b32 > 0  # yet elements outside atol + rtol * |dx|
        assert over16 > 0 and nf16 == over16  # every inf is an exact dx past fp16's range
    else:
        assert b32 == 0 and b16 == 0 and over16 == 0


def test_moving_rstd_far_passes_the_right_fp32_kernel_under_dx_scale_and_not_a_wrong_one():
    """Through the gate, rstd's fill back to perturb=True: the right fp32 kernel, rejected in round C under the
    unscaled dx bound (gates up to 6, the test above), passes under dx's error scale (gate 7: its atol in units of
    |x| |r|^3 sum|dout w x| / N, what a x's rounding grows with); a kernel using r^2 for r^3 is still rejected.
    rstd stays unperturbed for fp16's sake (an exact dx past 65504)."""
    old = {k: {**v, "rstd": replace(v["rstd"], perturb=True)} for k, v in FILLS.items()}
    v, _ = run(cell("fp32", 1024, 2048), fills=old)
    assert v.status is Status.OK, v.error
    v, _ = run(cell("fp32", 1024, 2048), bug="r_squared", fills=old)
    assert v.status is Status.WRONG_ANSWER and v.error.startswith("dx"), v.error


def test_dx_rounding_grows_with_its_dot_term_and_the_scale_follows():
    """A row of the perturbed "normal" set with one column where x, dout and w all moved far (a dot term of
    ~4600) and one element whose two dx terms cancel (dout set so): cluster_rows' right fp32 dx misses
    atol + rtol |dx| there, and stays >10x inside the bound scaled by |x| |r|^3 sum|dout w x| / N; a kernel
    using r^2 for r^3 is >100x outside the scaled bound."""
    m, n = 64, 4096
    rng = np.random.default_rng(3)
    x = quantize(rng.standard_normal((m, n)), DType.FP32)
    dy = quantize(rng.standard_normal((m, n)), DType.FP32)
    w = quantize(1 + 0.1 * rng.standard_normal(n), DType.FP32)
    r = quantize(1.7 + 0.05 * rng.standard_normal(m), DType.FP32)
    x[:, 7], dy[:, 7], w[7] = 16.3, -16.1, 17.9  # the big dot term, every row
    x[:, 100], dy[:, 100] = -15.7, 0.0
    # dout[:, 100] so that dx = r (dout w - x r^2 sum(dout w x) / N) is 0 there, solved for it
    r2, rest = r.astype(np.float64) ** 2, np.sum(dy.astype(np.float64) * w * x, axis=1)
    dy[:, 100] = quantize(x[:, 100] * r2 * rest / (n * w[100] * (1 - r2 * x[:, 100] ** 2 / n)), DType.FP32)
    ins = {"x": x, "w": w, "dout": dy, "rstd": r}
    ref = rmsnorm_bwd(ins, {})["dx"]
    t = SPEC.tolerance(cell("fp32", m, n), "dx")
    unscaled = t.atol + t.rtol * np.abs(ref)
    scaled = t.atol * bwd_device.error_scales(ins)["dx"] + t.rtol * np.abs(ref)
    dx, _ = cluster_rows(x, w, dy, r)
    err = np.abs(dx - ref)
    assert np.abs(ref[:, 100]).max() < 1e-4
    assert (err > unscaled).any() and err.max() > 2 * unscaled[err > unscaled].min()
    assert np.all(err < scaled / 10)
    wrong, _ = cluster_rows(x, w, dy, r, bug="r_squared")
    assert np.median(np.abs(wrong - ref) / scaled) > 100


def test_dw_rounding_grows_with_its_terms_and_the_scale_follows():
    """Terms of ~400 (x, dout ~20) whose column sums cancel to ~0: cluster_rows' right fp32 dw (66 and 264
    row groups, M = 32768) misses the unit-term atol 1e-5 sqrt(M) by >10x, and stays >10x inside it scaled
    by the column's rms term; a dropped row is still >100x outside the scaled bound."""
    m, n = 32768, 8
    rng = np.random.default_rng(0)
    x = quantize(rng.standard_normal((m, n)) * 20, DType.FP32)
    dy = quantize(rng.standard_normal((m, n)) * 20, DType.FP32)
    r = quantize(1 + 0.2 * rng.standard_normal(m), DType.FP32)
    half = rng.permutation(m)  # row b cancels row a exactly, in another row group
    a, b = half[: m // 2], half[m // 2:]
    x[b], dy[b], r[b] = -x[a], dy[a], r[a]
    ins = {"x": x, "w": np.ones(n), "dout": dy, "rstd": r}
    ref = rmsnorm_bwd(ins, {})["dw"]
    t = SPEC.tolerance(cell("fp32", m, n), "dw")
    limit = t.atol * bwd_device.error_scales(ins)["dw"] + t.rtol * np.abs(ref)
    assert np.all(np.abs(ref) < 1e-6)
    for groups in (66, 264):
        _, dw = cluster_rows(x, ins["w"], dy, r, groups=groups)
        err = np.abs(dw - ref)
        assert err.max() > 10 * (t.atol + t.rtol * np.abs(ref)).max(), groups
        assert np.all(err < limit / 10), groups
        _, short = cluster_rows(x, ins["w"], dy, r, groups=groups, bug="dw_short_row")
        assert np.all(np.abs(short - ref) > 100 * limit), groups


def test_a_dw_summed_in_fp16_still_fails_the_fp32_cell():
    """Gate 4's scaled dw bound still rejects a reduced-precision sum: the partials summed in fp16 (~3e-3
    relative) on an fp32 cell, against atol 1e-5 sqrt(M) x the rms term (~1 on the unperturbed sets)."""
    v, _ = run(CELLS[0], "dw_fp16_sum")
    assert CELLS[0].dtype("w") is DType.FP32
    assert v.status is Status.WRONG_ANSWER and v.error.startswith("dw"), v.error


class ScaledBy(BwdDevice):
    """BwdDevice whose dw error scale is a constant (the gate's wiring of 'scale:dw', apart from its value)."""

    def __init__(self, scale: float, *a, **kw):
        super().__init__(*a, **kw)
        self.scale = scale

    def launch(self, obj, kernel, grid, block, smem, args, side=False, pdl=False):
        super().launch(obj, kernel, grid, block, smem, args, side, pdl)
        if obj == "ref" and self._capturing is None and "_dw_" in kernel and len(args) == 8:  # scale:dw bound
            self.view(args[5][1], "float64", args[-1][1])[:] = self.scale


def test_the_gate_compares_dw_in_units_of_its_error_scale():
    """One dw element off by 3 atol: inside a scale of 10 (OK), outside without one (the op's hooks with
    SCALED removed: WRONG_ANSWER naming dw), outside a scale of 2."""
    import types

    c = cell("fp32", 96, 2048)
    off = 3 * SPEC.tolerance(c, "dw").atol
    plain = types.SimpleNamespace(**{k: v for k, v in vars(bwd_device).items() if k != "SCALED"})
    scales = (("buf", "scale:dw"), ("buf", "scale:dx"))
    plain.reference = lambda *a: [(k, g, b, tuple(x for x in args if x not in scales))
                                  for k, g, b, args in bwd_device.reference(*a)]
    verdicts = {}
    for name, scale, hooks in (("scaled 10", 10.0, bwd_device), ("scaled 2", 2.0, bwd_device),
                               ("unscaled", 10.0, plain)):
        dev = ScaledBy(scale, {"cand": fake_kernel(dw_off=off)}, baseline_us=None)
        v, _ = run(c, dev=dev, hooks=hooks)
        verdicts[name] = v
    assert verdicts["scaled 10"].status is Status.OK, verdicts["scaled 10"].error
    for name in ("scaled 2", "unscaled"):
        assert verdicts[name].status is Status.WRONG_ANSWER, name
        assert verdicts[name].error.startswith("dw"), verdicts[name].error

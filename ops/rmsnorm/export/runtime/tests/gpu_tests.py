"""The package on a CUDA GPU: every searched cell (forward and backward, the forward's variant cells:
residual, bias, store_rstd), off-table shapes, every API variant and autograd through forward and
backward (a residual call's too) against a float64 torch reference; each call takes the path explain()
names. Skipped, loudly, without a CUDA GPU."""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

import kf_pkg as kf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="SKIPPED: needs a CUDA GPU (none visible)")

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (atol, rtol, rel_norm) per output dtype: the factory's gate tolerances
TOL = {torch.float32: (1e-5, 1e-5, 1e-5), torch.float16: (2e-3, 2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1.6e-2, 8e-3)}
EPS = 1e-6
TABLES = kf.tables()
_VARIANT_DIMS = ("bias", "store_rstd")


def _is_variant(e) -> bool:
    return "residual" in dict(e.dtypes) or "out" in dict(e.dtypes) or any(d in dict(e.dims) for d in _VARIANT_DIMS)


FWD = [(dict(e.dtypes), dict(e.dims)) for e in TABLES["rmsnorm"].entries
       if not _is_variant(e)] if "rmsnorm" in TABLES else []
VARIANT_CELLS = [(dict(e.dtypes), dict(e.dims)) for e in TABLES["rmsnorm"].entries
                 if _is_variant(e) and "out" not in dict(e.dtypes)] if "rmsnorm" in TABLES else []
# (x dtype, residual dtype, shape) of prenorm calls: the residual cells' dtypes (where the export has them)
# at table-build M, an off-table N, an odd N, a 3-d input; each call takes the path explain() names
RESIDUAL_CALLS = [("bfloat16", "bfloat16", (64, 4096)), ("bfloat16", "bfloat16", (37, 1000)),
                  ("float16", "float16", (129, 1024)), ("bfloat16", "float32", (19, 4096)),
                  ("bfloat16", "bfloat16", (2, 3, 2048)), ("float16", "float16", (77, 12288))]
BWD = [(dict(e.dtypes), dict(e.dims)) for e in TABLES["rmsnorm_bwd"].entries] if "rmsnorm_bwd" in TABLES else []
OFF_TABLE = [  # (x dtype, w dtype, shape): tails, M = 1, odd N, mixed weight dtype, long rows, 3-d input
    ("bfloat16", "bfloat16", (1, 1024)), ("bfloat16", "bfloat16", (37, 1000)), ("float16", "float16", (5, 4100)),
    ("float32", "float32", (3, 33)), ("bfloat16", "bfloat16", (1059, 3072)), ("float16", "float16", (77, 12288)),
    ("bfloat16", "float32", (19, 2048)), ("float16", "float32", (19, 2056)), ("bfloat16", "bfloat16", (2, 65536)),
    ("float32", "float32", (4, 7, 768)), ("bfloat16", "bfloat16", (3, 262144)),
]
BWD_OFF_TABLE = [  # another M of a searched N (prebuilt cubins, cluster ones included), new N, odd N, other dtypes
    ("bfloat16", "bfloat16", (1, 4096)), ("bfloat16", "bfloat16", (37, 8192)),
    ("bfloat16", "bfloat16", (1059, 16384)), ("bfloat16", "bfloat16", (37, 65536)),
    ("bfloat16", "bfloat16", (3, 262144)), ("bfloat16", "bfloat16", (600, 131072)),
    ("bfloat16", "bfloat16", (77, 12288)), ("bfloat16", "bfloat16", (37, 1000)), ("bfloat16", "bfloat16", (3, 33)),
    ("float16", "float16", (129, 8192)), ("float32", "float32", (19, 2048)), ("bfloat16", "float32", (19, 4096)),
    ("bfloat16", "bfloat16", (2, 3, 5, 8192)),
]
AUTOGRAD = [  # (x dtype, shape): table builds of the backward where one was exported, and off-table shapes
    ("bfloat16", (64, 4096)), ("bfloat16", (512, 8192)), ("bfloat16", (96, 65536)), ("float16", (37, 1000)),
    ("float32", (8, 3, 2048)),
]


def _label(dt: dict, dims: dict) -> str:
    res = f"residual={dt['residual']}," if "residual" in dt else ""
    return f"{res}x={dt['x']},w={dt['w']}-" + "-".join(f"{k}{v}" for k, v in sorted(dims.items()))


def inputs(xdt: str, wdt: str, shape: tuple, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(shape, device="cuda", generator=g) * 2).to(TORCH[xdt])
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).to(TORCH[wdt])
    return x, w


def ref_fwd(x, w=None, bias=None, residual=None, eps=EPS):
    h = x.double() + (residual.double() if residual is not None else 0)
    y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    y = y * w.double() if w is not None else y
    return (y + bias.double() if bias is not None else y), h


def assert_close(got, ref, dtype, atol_scale: float = 1.0):
    atol, rtol, rel = TOL[dtype]
    assert got.shape == ref.shape
    g = got.double()
    assert torch.isfinite(g).all(), "non-finite values"
    err = (g - ref).abs()
    bad = err > atol * atol_scale + rtol * ref.abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements off (max |err| {float(err.max()):.3g})"
    assert float(torch.linalg.vector_norm(g - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-30)) <= rel


@pytest.mark.parametrize("dt,dims", FWD, ids=[_label(*c) for c in FWD])
def test_searched_cells_forward(dt, dims):
    x, w = inputs(dt["x"], dt["w"], (dims["M"], dims["N"]))
    assert kf.explain(x.shape, x.dtype, w.dtype).path == "table"
    before = kf.stats().get("rmsnorm", {}).get("table", 0)
    y = kf.rmsnorm(x, w, eps=EPS)
    assert kf.stats()["rmsnorm"]["table"] == before + 1
    assert y.dtype == x.dtype
    assert_close(y, ref_fwd(x, w)[0], x.dtype)


@pytest.mark.parametrize("xdt,wdt,shape", OFF_TABLE, ids=[f"{a}-{b}-{'x'.join(map(str, s))}" for a, b, s in OFF_TABLE])
def test_off_table_shapes_forward_and_the_path_explain_names(xdt, wdt, shape):
    x, w = inputs(xdt, wdt, shape, seed=1)
    c = kf.explain(shape, xdt, wdt)
    before = dict(kf.stats().get("rmsnorm", {}))
    y = kf.rmsnorm(x, w, eps=EPS)
    assert_close(y, ref_fwd(x, w)[0], x.dtype)
    after = kf.stats()["rmsnorm"]
    took = [p for p in after if after[p] != before.get(p, 0)]
    assert took == [c.path], f"explain said {c}, the call took {took}"


def check_bwd(x, w, dout, r, dx, dw):
    """dx and dw of a (M, N) problem against float64, a slab of rows at a time (long rows, large M)."""
    m, n = x.shape
    rows = max(1, (1 << 27) // n)
    dw_ref = torch.zeros(n, dtype=torch.float64, device=x.device)
    for s in range(0, m, rows):
        rs = r[s:s + rows].double()[:, None]
        xhat = x[s:s + rows].double() * rs
        g = dout[s:s + rows].double() * w.double()
        assert_close(dx[s:s + rows], rs * (g - xhat * (g * xhat).mean(-1, keepdim=True)), x.dtype)
        dw_ref += (dout[s:s + rows].double() * xhat).sum(0)
    assert_close(dw, dw_ref, w.dtype, atol_scale=math.sqrt(m))


def _took(op: str, before: dict) -> list[str]:
    after = kf.stats().get(op, {})
    return [p for p in after if after[p] != before.get(p, 0)]


@pytest.mark.parametrize("dt,dims", BWD, ids=[_label(*c) for c in BWD])
def test_searched_cells_backward(dt, dims):
    m, n = dims["M"], dims["N"]
    x, w = inputs(dt["x"], dt["w"], (m, n))
    dout = torch.randn_like(x)
    r = torch.rsqrt(x.float().square().mean(-1) + EPS)
    c = kf.explain(x.shape, x.dtype, w.dtype, op="rmsnorm_bwd")
    assert c.path == "table", str(c)
    before = dict(kf.stats().get("rmsnorm_bwd", {}))
    dx, dw, _, _ = kf.rmsnorm_bwd(x, w, dout, r)
    assert _took("rmsnorm_bwd", before) == ["table"]
    assert dx.dtype == x.dtype and dw.dtype == w.dtype and dw.shape == (n,)
    check_bwd(x, w, dout, r, dx, dw)
    dx2, dw2, _, _ = kf.rmsnorm_bwd(x, w, dout, r)  # the workspace is written before it is read: same answer
    assert torch.equal(dx2, dx) and torch.equal(dw2, dw)


@pytest.mark.parametrize("xdt,wdt,shape", BWD_OFF_TABLE,
                         ids=[f"{a}-{b}-{'x'.join(map(str, s))}" for a, b, s in BWD_OFF_TABLE])
def test_off_table_shapes_backward_and_the_path_explain_names(xdt, wdt, shape):
    x, w = inputs(xdt, wdt, shape, seed=7)
    dout = torch.randn_like(x)
    r = torch.rsqrt(x.float().square().mean(-1) + EPS)
    c = kf.explain(shape, xdt, wdt, op="rmsnorm_bwd")
    before = dict(kf.stats().get("rmsnorm_bwd", {}))
    dx, dw, _, _ = kf.rmsnorm_bwd(x, w, dout, r)
    assert _took("rmsnorm_bwd", before) == [c.path], f"explain said {c}, the call took another path"
    assert dx.shape == x.shape
    n = shape[-1]
    check_bwd(x.reshape(-1, n), w, dout.reshape(-1, n), r.reshape(-1), dx.reshape(-1, n), dw)


def test_backward_with_dout_of_another_dtype_takes_torch_and_is_right():
    x, w = inputs("bfloat16", "bfloat16", (64, 4096), seed=8)
    dout = torch.randn(x.shape, device="cuda")  # float32
    r = torch.rsqrt(x.float().square().mean(-1) + EPS)
    assert kf.explain(x.shape, x.dtype, op="rmsnorm_bwd", dout_dtype=dout.dtype).path == "torch"
    before = dict(kf.stats().get("rmsnorm_bwd", {}))
    dx, dw, _, _ = kf.rmsnorm_bwd(x, w, dout, r)
    assert _took("rmsnorm_bwd", before) == ["torch"]
    check_bwd(x, w, dout, r, dx, dw)


@pytest.mark.parametrize("xdt,shape", AUTOGRAD, ids=[f"{a}-{'x'.join(map(str, s))}" for a, s in AUTOGRAD])
def test_autograd_matches_float64(xdt, shape):
    x, w = inputs(xdt, xdt, shape, seed=2)
    x.requires_grad_(True)
    w.requires_grad_(True)
    dy = torch.randn_like(x)
    fwd, bwd = (kf.explain(shape, xdt, op=op) for op in ("rmsnorm", "rmsnorm_bwd"))
    before = {op: dict(kf.stats().get(op, {})) for op in ("rmsnorm", "rmsnorm_bwd")}
    kf.rmsnorm(x, w, eps=EPS).backward(dy)
    assert _took("rmsnorm", before["rmsnorm"]) == [fwd.path], str(fwd)
    assert _took("rmsnorm_bwd", before["rmsnorm_bwd"]) == [bwd.path], str(bwd)
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    ref_fwd(x64, w64)[0].backward(dy.double())
    rows = math.prod(shape[:-1])
    assert_close(x.grad, x64.grad, x.dtype)
    assert_close(w.grad, w64.grad, w.dtype, atol_scale=math.sqrt(rows))


def test_variants_through_the_fallback_are_right():
    x, w = inputs("bfloat16", "bfloat16", (33, 1024), seed=3)
    res = torch.randn_like(x)
    b = torch.randn(1024, device="cuda").to(torch.bfloat16)
    assert_close(kf.rmsnorm(x, None, eps=EPS), ref_fwd(x)[0], x.dtype)
    assert_close(kf.rmsnorm(x, w, b, eps=EPS), ref_fwd(x, w, b)[0], x.dtype)
    out, res_out = kf.rmsnorm(x, w, residual=res, eps=EPS, prenorm=True)
    y, h = ref_fwd(x, w, residual=res)
    assert_close(out, y, x.dtype)
    assert_close(res_out, h, res.dtype)
    y32 = kf.rmsnorm(x, w, out_dtype=torch.float32, eps=EPS)
    assert y32.dtype == torch.float32
    assert_close(y32, ref_fwd(x, w)[0], torch.bfloat16)  # inputs are bf16: the bf16 tolerance
    out, res_out = kf.rmsnorm(x, w, residual_dtype=torch.float32, eps=EPS, prenorm=True)
    assert res_out.dtype == torch.float32 and torch.equal(res_out, x.float())
    _, ro, r = kf.rmsnorm_fwd(x, w, eps=EPS, store_rstd=True)
    assert ro is x and r.shape == (33,)
    assert_close(r, torch.rsqrt(x.double().square().mean(-1) + EPS), torch.float32)


def test_autograd_through_the_fallback_with_bias_and_residual():
    x, w = inputs("float32", "float32", (16, 512), seed=4)
    res, b = torch.randn_like(x), torch.randn(512, device="cuda")
    leaves = [t.requires_grad_(True) for t in (x, w, res, b)]
    out, res_out = kf.rmsnorm(x, w, b, res, eps=EPS, prenorm=True)
    (out.sum() + 2 * res_out.sum()).backward()
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    y, h = ref_fwd(ref[0], ref[1], ref[3], ref[2])
    (y.sum() + 2 * h.sum()).backward()
    for got, want in zip(leaves, ref):
        assert_close(got.grad, want.grad, torch.float32, atol_scale=4.0)


def test_torch_compile_traces_the_custom_op():
    x, w = inputs("bfloat16", "bfloat16", (128, 4096), seed=5)
    f = torch.compile(lambda a, b: kf.rmsnorm(a, b, eps=EPS), fullgraph=True)
    assert_close(f(x, w), ref_fwd(x, w)[0], x.dtype)


def test_module_matches_torch_rmsnorm():
    m = kf.RMSNorm(2048, eps=EPS, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(1 + 0.1 * torch.randn(2048, device="cuda"))
    x, _ = inputs("bfloat16", "bfloat16", (4, 9, 2048), seed=6)
    assert_close(m(x), ref_fwd(x, m.weight)[0], x.dtype)


@pytest.mark.parametrize("dt,dims", VARIANT_CELLS, ids=[_label(*c) for c in VARIANT_CELLS])
def test_searched_variant_cells_forward(dt, dims):
    """Each variant cell (residual, bias, store_rstd) by its table kernel: out, residual_out and rstd."""
    m, n = dims["M"], dims["N"]
    x, w = inputs(dt["x"], dt["w"], (m, n), seed=11)
    g = torch.Generator(device="cuda").manual_seed(12)
    res = torch.randn((m, n), device="cuda", generator=g).to(TORCH[dt["residual"]]) if "residual" in dt else None
    b = (0.5 * torch.randn(n, device="cuda", generator=g)).to(w.dtype) if dims.get("bias") else None
    store = bool(dims.get("store_rstd"))
    c = kf.explain(x.shape, x.dtype, w.dtype, residual=dt.get("residual", False), bias=b is not None, store_rstd=store)
    assert c.path == "table", str(c)
    before = dict(kf.stats().get("rmsnorm", {}))
    out, res_out, r = kf.rmsnorm_fwd(x, w, b, res, eps=EPS, store_rstd=store)
    assert _took("rmsnorm", before) == ["table"]
    y, h = ref_fwd(x, w, b, res)
    assert out.dtype == x.dtype
    assert_close(out, y, x.dtype)
    if res is not None:
        assert res_out.dtype == res.dtype
        assert_close(res_out, h, res.dtype)
    else:
        assert res_out is x
    if store:
        assert r.dtype == torch.float32 and r.shape == (m,)
        assert_close(r, torch.rsqrt(h.square().mean(-1) + EPS), torch.float32)


@pytest.mark.parametrize("xdt,rdt,shape", RESIDUAL_CALLS,
                         ids=[f"{a}-{b}-{'x'.join(map(str, s))}" for a, b, s in RESIDUAL_CALLS])
def test_residual_call_and_its_gradients_match_float64(xdt, rdt, shape):
    """A prenorm call (h = x + residual, residual_out = h, out = rmsnorm(h)): out and residual_out, and the
    gradients of x, weight and residual (dresidual = dx = dh + dresidual_out) against float64 autograd;
    forward and backward take the paths explain() names."""
    x, w = inputs(xdt, xdt, shape, seed=13)
    g = torch.Generator(device="cuda").manual_seed(14)
    res = torch.randn(shape, device="cuda", generator=g).to(TORCH[rdt])
    leaves = [t.requires_grad_(True) for t in (x, w, res)]
    fwd = kf.explain(shape, xdt, residual=rdt)
    bwd = kf.explain(shape, rdt, xdt, op="rmsnorm_bwd", dout_dtype=xdt)  # the backward runs on h (residual's dtype)
    before = {op: dict(kf.stats().get(op, {})) for op in ("rmsnorm", "rmsnorm_bwd")}
    out, res_out = kf.rmsnorm(x, w, residual=res, eps=EPS, prenorm=True)
    assert _took("rmsnorm", before["rmsnorm"]) == [fwd.path], str(fwd)
    assert out.dtype == x.dtype and res_out.dtype == res.dtype
    dy, dro = torch.randn_like(out), torch.randn_like(res_out)
    torch.autograd.backward([out, res_out], [dy, dro])
    if fwd.kernel:  # the variant custom op's backward: rmsnorm_bwd on h
        assert _took("rmsnorm_bwd", before["rmsnorm_bwd"]) == [bwd.path], str(bwd)
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    y, h = ref_fwd(ref[0], ref[1], residual=ref[2])
    assert_close(out, y.detach(), x.dtype)
    assert_close(res_out, h.detach(), res.dtype)
    torch.autograd.backward([y, h], [dy.double(), dro.double()])
    rows = math.prod(shape[:-1])
    assert_close(x.grad, ref[0].grad, x.dtype, atol_scale=2.0)
    assert_close(res.grad, ref[2].grad, x.dtype, atol_scale=2.0)  # dh + dresidual_out, from x's dtype's dy
    assert_close(w.grad, ref[1].grad, w.dtype, atol_scale=math.sqrt(rows))


def test_variant_calls_no_kernel_serves_take_torch_and_are_right():
    """A residual dtype no variant cell has, another out_dtype, and a bias of another dtype than the weight."""
    x, w = inputs("bfloat16", "bfloat16", (33, 1024), seed=15)
    res = torch.randn(33, 1024, device="cuda").to(torch.float16)
    c = kf.explain(x.shape, x.dtype, residual=res.dtype)
    before = dict(kf.stats().get("rmsnorm", {}))
    out, res_out = kf.rmsnorm(x, w, residual=res, eps=EPS, prenorm=True)
    assert _took("rmsnorm", before) == [c.path], str(c)
    y, h = ref_fwd(x, w, residual=res)
    assert_close(out, y, x.dtype)
    assert_close(res_out, h, res.dtype)
    r16 = res.to(torch.bfloat16)
    c = kf.explain(x.shape, x.dtype, residual=True, out_dtype=torch.float32)
    assert c.path == "torch" and "out_dtype" in c.reason
    out, res_out, _ = kf.rmsnorm_fwd(x, w, None, r16, out_dtype=torch.float32, eps=EPS)
    assert out.dtype == torch.float32
    assert_close(out, ref_fwd(x, w, residual=r16)[0], torch.bfloat16)
    b32 = torch.randn(1024, device="cuda")  # bias in fp32, weight bf16: the kernels read it in w's dtype
    before = dict(kf.stats().get("rmsnorm", {}))
    out = kf.rmsnorm(x, w, b32, eps=EPS)
    assert _took("rmsnorm", before) == ["torch"]
    assert_close(out, ref_fwd(x, w, b32)[0], x.dtype)


@pytest.mark.skipif(not FWD, reason="no plain forward cell exported")
def test_a_table_kernel_is_probed_once_per_shape_class_and_a_failed_probe_drops_it(monkeypatch):
    """On the GPU: a searched kernel's first call in a class runs the probe (launched at the class's M on its own
    inputs), later calls of the class do not; a probe that reports a wrong output drops the kernel with one warning
    and its calls take the torch path (right still)."""
    from kf_pkg import run
    from kf_pkg.firstuse import reduced

    dt, dims = FWD[0]
    rt = run.runtime()
    monkeypatch.setattr(rt, "checked", set())  # as in a fresh process
    monkeypatch.setattr(rt, "bad", {})
    monkeypatch.setattr(rt, "fast", {})  # no direct launch learned yet
    probes, real = [], rt.probe

    def counted(c, device):
        probes.append(dict(c.dims)["M"])
        return real(c, device)

    monkeypatch.setattr(rt, "probe", counted)
    torch_calls = rt.counts[("rmsnorm", "torch")]
    for m in (dims["M"], dims["M"] + 64, dims["M"] + 1):
        x, w = inputs(dt["x"], dt["w"], (m, dims["N"]))
        assert_close(kf.rmsnorm(x, w, eps=EPS), ref_fwd(x, w)[0], x.dtype)
    assert probes == [reduced(dims["M"]), reduced(dims["M"] + 1)] and rt.counts[("rmsnorm", "torch")] == torch_calls
    monkeypatch.setattr(rt, "checked", set())
    monkeypatch.setattr(rt, "fast", {})
    monkeypatch.setattr(rt, "probe", lambda c, device: "y: planted")
    x, w = inputs(dt["x"], dt["w"], (dims["M"], dims["N"]))
    with pytest.warns(RuntimeWarning, match="planted"):
        assert_close(kf.rmsnorm(x, w, eps=EPS), ref_fwd(x, w)[0], x.dtype)
    assert rt.counts[("rmsnorm", "torch")] == torch_calls + 1


ELEMENTS_2_31 = 1 << 31


def _past_2_31(entries) -> list[tuple[str, str, int]]:
    """(x dtype, w dtype, N) of the first searched cell of each x dtype: a call there past 2^31 elements keeps its
    table kernel (only M changes)."""
    out = {}
    for dt, dims in entries:
        out.setdefault(dt["x"], (dt["x"], dt["w"], dims["N"]))
    return sorted(out.values())


def _room_for(nbytes: int) -> None:
    free, _ = torch.cuda.mem_get_info()
    if free < 1.2 * nbytes:
        pytest.skip(f"SKIPPED: a call past 2^31 elements needs ~{nbytes / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")


@pytest.mark.parametrize("xdt,wdt,n", _past_2_31(FWD), ids=lambda v: str(v))
def test_a_forward_call_past_2_31_elements_is_right(xdt, wdt, n):
    """M x N > 2^31 elements at a searched N (an int32 offset would wrap): rows at the start, the middle and the end
    against float64, on the path explain() names; skipped where the GPU lacks the memory."""
    m = ELEMENTS_2_31 // n + 3
    _room_for(2 * m * n * TORCH[xdt].itemsize)
    x = torch.randn((m, n), device="cuda", dtype=TORCH[xdt])
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(TORCH[wdt])
    before = dict(kf.stats().get("rmsnorm", {}))
    y = kf.rmsnorm(x, w, eps=EPS)
    assert _took("rmsnorm", before) == [kf.explain((m, n), xdt, wdt).path]
    rows = torch.tensor([0, 1, m // 2, m - 2, m - 1], device="cuda")
    assert_close(y.index_select(0, rows), ref_fwd(x.index_select(0, rows), w)[0], x.dtype)
    del x, y


@pytest.mark.parametrize("xdt,wdt,n", _past_2_31(BWD), ids=lambda v: str(v))
def test_a_backward_call_past_2_31_elements_is_right(xdt, wdt, n):
    """The backward at M x N > 2^31 elements: dx and dw against float64 (a slab of rows at a time); skipped where the
    GPU lacks the memory."""
    m = ELEMENTS_2_31 // n + 3
    _room_for(m * n * (3 * TORCH[xdt].itemsize + 8) + 4 * min(m, 1024) * n)  # and x's squares in fp32
    x = torch.randn((m, n), device="cuda", dtype=TORCH[xdt])
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(TORCH[wdt])
    dout = torch.randn((m, n), device="cuda", dtype=TORCH[xdt])
    r = torch.rsqrt(x.float().square().mean(-1) + EPS)
    before = dict(kf.stats().get("rmsnorm_bwd", {}))
    dx, dw, _, _ = kf.rmsnorm_bwd(x, w, dout, r)
    assert _took("rmsnorm_bwd", before) == [kf.explain((m, n), xdt, wdt, op="rmsnorm_bwd").path]
    check_bwd(x, w, dout, r, dx, dw)
    del x, dout, dx


SERVING_CALLS = [("bfloat16", None, (1, 4096)), ("float16", None, (3, 5, 2048)), ("bfloat16", "bfloat16", (8, 4096))]


@pytest.mark.parametrize("xdt,rdt,shape", SERVING_CALLS, ids=lambda v: str(v))
def test_a_repeated_call_takes_its_direct_launch_with_the_same_results(xdt, rdt, shape):
    """The serving path: after a signature's first call its kernel is launched directly (the runtime's `fast`). Its
    results are the first call's, bit for bit, and right on fresh inputs, graph capture included; its calls are
    counted under the first call's path; a call needing autograd and an unaligned view leave it (right as before)."""
    from kf_pkg import api, run

    x, w = inputs(xdt, xdt, shape, seed=3)
    res = (torch.randn(shape, device="cuda") * 2).to(TORCH[rdt]) if rdt else None

    def call(a, r):
        return kf.rmsnorm_fwd(a, w, residual=r, eps=EPS)[:2]

    first = call(x, res)
    path = kf.explain(shape, x.dtype, residual=TORCH[rdt] if rdt else False).path
    if path == "torch":
        pytest.skip(f"SKIPPED: no kernel serves {shape} {xdt} residual={rdt} in this export")
    d = run.runtime().fast.get(api._signature(x, w, res))
    assert d, "no direct launch learned after the first call"
    # the driver's cuLaunchKernel on a parameter array made once, unless switched off; one whose outputs disagreed
    # with the routed call's would have fallen back to cuda.core's launch (with a warning)
    assert d.raw == (os.environ.get("KF_RAW_LAUNCH", "1") != "0"), "the raw launch fell back to cuda.core's"
    calls, before = d.calls, kf.stats()["rmsnorm"][path]
    for seed in (4, 5):
        x2, _ = inputs(xdt, xdt, shape, seed=seed)
        r2 = (torch.randn(shape, device="cuda") * 2).to(TORCH[rdt]) if rdt else None
        y, ro = call(x2, r2)
        assert d.calls == calls + 1 and kf.stats()["rmsnorm"][path] == before + 1
        calls, before = d.calls, before + 1
        ref, h = ref_fwd(x2, w, residual=r2)
        assert_close(y, ref, x.dtype)
        if rdt:
            assert torch.equal(ro, h.to(TORCH[rdt]))
    again = call(x, res)
    assert torch.equal(again[0], first[0]) and (not rdt or torch.equal(again[1], first[1]))
    out = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(call(x, res)[0])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first[0])
    xg = x.clone().requires_grad_(True)  # autograd: the slow path
    yg = call(xg, res)[0]
    assert yg.requires_grad and d.calls == calls + 2
    wide = torch.empty(*shape[:-1], shape[-1] + 1, dtype=x.dtype, device="cuda")
    wide[..., 1:] = x  # a view 2 bytes off 16-byte alignment: copied by the slow path
    assert torch.equal(call(wide[..., 1:], res)[0], first[0]) and d.calls == calls + 2
    # given the tensors to write, the direct launch allocates nothing and returns them
    y_into = torch.full_like(x, float("nan"))
    r_into = torch.full_like(res, float("nan")) if rdt else None
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    got = kf.rmsnorm_fwd(x, w, residual=res, eps=EPS, out=y_into, residual_out=r_into)
    assert torch.cuda.memory_allocated() == held and d.calls == calls + 3
    assert got[0] is y_into and torch.equal(y_into, first[0]) and (not rdt or (got[1] is r_into
                                                                               and torch.equal(r_into, first[1])))

"""The package on any machine (no GPU, no torch needed): its data is whole and consistent, its renderer
gives back the shipped sources, and explain() names a path for table and off-table shapes of every op
exported (a forward run, a backward run, or both), and of every variant the forward's cells have
(residual, bias, store_rstd), with their kernels' args bound as the factory's gate binds them."""

from __future__ import annotations

import hashlib
import json
import re

import kf_pkg as kf
import pytest
from kf_pkg.args import bind_args
from kf_pkg.choose import PLAIN, choose, describe, variant_key
from kf_pkg.expr import DATA, short
from kf_pkg.loader import PlanError, check_grid, cluster_dims, source_for

TABLES = kf.tables()
OPS = sorted(TABLES)
BUILDS = [(op, b) for op, t in TABLES.items() for b in t.builds.values()]
ENTRIES = [(op, e) for op, t in TABLES.items() for e in t.entries]


def _variant(e) -> tuple:
    return variant_key(dict(e.dtypes), dict(e.dims))


PLAIN_ENTRIES = {op: [e for e in t.entries if _variant(e) == PLAIN] for op, t in TABLES.items()}
VARIANTS = [e for e in TABLES["rmsnorm"].entries if _variant(e) != PLAIN] if "rmsnorm" in TABLES else []
VARIANT_TENSORS = ("residual", "residual_out", "bias", "rstd")
# off-table shapes per op: M = 1, odd M and N, 3-d input, long rows, an N no cell has
OFF_TABLE = {"rmsnorm": [(1, 1000), (37, 4100), (3, 33), (7, 5, 3072), (2, 262144)],
             "rmsnorm_bwd": [(1, 4096), (37, 1000), (3, 33), (7, 5, 12288), (3, 262144), (1059, 65536)]}


def _arch() -> int:
    return TABLES[OPS[0]].arch_number


def _shape(e) -> tuple[int, int]:
    return dict(e.dims)["M"], dict(e.dims)["N"]


def test_files_are_there_and_match_their_hashes():
    doc = json.loads((DATA / "dispatch.json").read_text())
    assert OPS and set(OPS) <= {"rmsnorm", "rmsnorm_bwd"}
    for op, t in doc["ops"].items():
        assert t["entries"], op
        for b in t["builds"].values():
            assert hashlib.sha256((DATA / b["cu"]).read_bytes()).hexdigest() == b["cu_sha256"]
            assert hashlib.sha256((DATA / b["cubin"]).read_bytes()).hexdigest() == b["cubin_sha256"]
        for tid, tm in t["templates"].items():
            assert (DATA / tm["file"]).exists(), tid
            assert hashlib.sha256((DATA / tm["file"]).read_bytes()).hexdigest() == tm["source_hash"], tid


@pytest.mark.parametrize("op,build", BUILDS, ids=[f"{op}-{b.id}" for op, b in BUILDS])
def test_renderer_gives_back_the_shipped_source(op, build):
    t = TABLES[op].templates[build.template]
    src = t.render(dict(build.params), TABLES[op].arch_number, dict(build.dtypes), dict(build.consts))
    assert src == (DATA / build.cu).read_text()


@pytest.mark.parametrize("op,entry", ENTRIES, ids=[f"{op}-{e.cell}" for op, e in ENTRIES])
def test_every_searched_cell_takes_its_table_kernel(op, entry):
    c = choose(op, entry.dims, entry.dtypes, TABLES[op].arch_number)
    assert (c.path, c.build, c.template, c.params) == ("table", entry.build, entry.template, entry.params), str(c)
    t = TABLES[op].templates[c.template]
    launches, workspaces = t.plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))
    assert launches and all(ln.grid[0] >= 1 and 32 <= ln.block[0] * ln.block[1] <= 1024 for ln in launches)
    names = {x.name for x in TABLES[op].tensors} | dict(entry.dims).keys() | dict(TABLES[op].scalars).keys()
    assert all(a.partition(":")[0].removesuffix("?") in names | workspaces.keys() for ln in launches for a in ln.args)
    assert workspaces.keys() == dict(t.workspaces).keys() and all(b > 0 for b in workspaces.values())
    source = source_for(TABLES[op], c)
    assert all(re.search(rf"__global__[^;{{]*\b{ln.kernel}\s*\(", source) for ln in launches)
    clusters = cluster_dims(source)
    for ln in launches:
        check_grid(ln, clusters)  # a grid that is not a multiple of the kernel's cluster cannot launch


def test_cluster_dims_and_the_grid_check():
    src = ('extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256, 1)\nrows(int* a) {}\n'
           'extern "C" __global__ void __launch_bounds__(32)\nreduce(int* a) {}\n')
    assert cluster_dims(src) == {"rows": (4, 1, 1)}
    from kf_pkg.table import Launch

    check_grid(Launch("rows", (8, 3, 1), (256, 1, 1), 0, ()), cluster_dims(src))
    check_grid(Launch("reduce", (7, 1, 1), (32, 1, 1), 0, ()), cluster_dims(src))
    with pytest.raises(PlanError, match="not a multiple of its cluster"):
        check_grid(Launch("rows", (6, 3, 1), (256, 1, 1), 0, ()), cluster_dims(src))


@pytest.mark.parametrize("op", sorted(OFF_TABLE))
def test_off_table_shapes_get_a_named_path_and_launchable_plans(op):
    arch = _arch()
    for shape in OFF_TABLE[op]:
        c = kf.explain(shape, "bfloat16", op=op, arch=arch)
        assert c.path in kf.PATHS and c.path != "table" and c.reason, str(c)
        assert str(c).startswith(f"{op} ")
        if op not in TABLES:
            assert c.path == "torch" and f"no {op} run was exported" in c.reason, str(c)
            continue
        if not c.kernel:
            continue
        table = TABLES[op]
        t = table.templates[c.template]
        assert not t.violations(dict(c.params), arch, dict(c.dtypes), dict(c.dims)), str(c)
        assert dict(c.consts) == {d: dict(c.dims).get(d, 0) for d in t.specialize}  # a switch off where absent
        source = source_for(table, c)  # a re-rendered or repaired kernel renders here, with the shipped macros
        assert "__global__" in source and all(f"{v}" in source for v in dict(c.consts).values())
        launches, _ = t.plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))
        clusters = cluster_dims(source)
        for ln in launches:
            check_grid(ln, clusters)


def test_variants_the_kernels_do_not_compute_say_torch():
    arch = _arch()
    op = OPS[0]
    e = (PLAIN_ENTRIES[op] or TABLES[op].entries)[0]
    shape, dt = _shape(e), dict(e.dtypes)["x"]
    assert kf.explain(shape, dt, dict(e.dtypes)["w"], op=op, arch=arch).path in ("table", "table-build")
    have = {_variant(v)[1:] + (bool(_variant(v)[0]),) for v in TABLES[op].entries} if op == "rmsnorm" else set()
    for kw, word, key in [({"bias": True}, "bias", ("", 1, 0, False)), ({"residual": True}, "residual", ("", 0, 0, True)),
                          ({"out_dtype": "float32" if dt != "float32" else "bfloat16"}, "out_dtype", None)]:
        c = kf.explain(shape, dt, op=op, arch=arch, **kw)
        if key in have:  # the export has cells of this variant: their kernels serve it
            assert c.path != "torch" or word not in c.reason, str(c)
        else:
            assert c.path == "torch" and word in c.reason, str(c)
    assert "ones" in str(kf.explain(shape, dt, dict(e.dtypes)["w"], op=op, arch=arch, weight=False))


@pytest.mark.parametrize("entry", VARIANTS, ids=[e.cell for e in VARIANTS])
def test_variant_cells_take_their_kernel_with_args_bound_as_the_gate_binds_them(entry):
    """Every variant cell (residual, bias, store_rstd) takes its table kernel; the launch binds the variant's
    tensors at the template's "name?" args and null pointers at the others, in the plan's order."""
    arch = _arch()
    table = TABLES["rmsnorm"]
    residual, _, bias, store_rstd = _variant(entry)
    dt, dims = dict(entry.dtypes), dict(entry.dims)
    c = kf.explain((dims["M"], dims["N"]), dt["x"], dt["w"], arch=arch, residual=residual or False, bias=bool(bias),
                   store_rstd=bool(store_rstd))
    assert (c.path, c.build, c.source_cell) == ("table", entry.build, entry.cell), str(c)
    assert dict(c.consts) == {d: dims.get(d, table.dim_defaults.get(d)) for d in table.templates[c.template].specialize}
    launches, _ = table.templates[c.template].plan(dict(c.params), arch, dict(c.dtypes), dict(c.dims))
    used = {"residual": bool(residual), "residual_out": bool(residual), "bias": bool(bias), "rstd": bool(store_rstd)}
    ptrs = {n: 0x1000 * (i + 1) for i, n in enumerate(("x", "w", "y", *VARIANT_TENSORS)) if used.get(n, True)}
    for ln in launches:
        args = bind_args(ln.args, ptrs, dict(c.dims), {"eps": 1e-6}, dict(table.scalars), c.template)
        assert len(args) == len(ln.args)
        for a, v in zip(ln.args, args):
            name = a.partition(":")[0].removesuffix("?")
            if name in ptrs:
                assert int(v) == ptrs[name], f"{a}: {v}"
            elif name in VARIANT_TENSORS:  # not this variant's: a null pointer, never touched
                assert a.partition(":")[0].endswith("?") and int(v) == 0, f"{a}: {v}"
    for tname in VARIANT_TENSORS:  # the kernel reads and writes the variant's tensors, and only those
        named = [a for ln in launches for a in ln.args if a.partition(":")[0].removesuffix("?") == tname]
        assert bool(named) or not used[tname], f"{c.template} binds no {tname}"


def test_variant_calls_off_the_table_and_the_ones_no_cell_serves():
    if not VARIANTS:
        pytest.skip("no variant cell exported")
    arch = _arch()
    e = VARIANTS[0]
    residual, _, bias, store_rstd = _variant(e)
    dt, n = dict(e.dtypes), dict(e.dims)["N"]
    kw = {"residual": residual or False, "bias": bool(bias), "store_rstd": bool(store_rstd)}
    other_m = kf.explain((37, n), dt["x"], dt["w"], arch=arch, **kw)
    assert (other_m.path, other_m.build) == ("table-build", e.build), str(other_m)
    searched_n = {dict(v.dims)["N"] for v in VARIANTS if _variant(v) == _variant(e)}
    new_n = next(k for k in (2048, 3072, 6144, 12288) if k not in searched_n)
    off = kf.explain((5, new_n), dt["x"], dt["w"], arch=arch, **kw)
    assert off.path in ("rerender", "repaired") and dict(off.consts)["N"] == new_n and not off.build, str(off)
    assert "residual=" in off.head() if residual else "residual=" not in off.head()
    odd = kf.explain((3, 1000), dt["x"], dt["w"], arch=arch, **kw)
    assert odd.path in ("rerender", "repaired", "torch") and odd.reason, str(odd)
    if odd.kernel:
        t = TABLES["rmsnorm"].templates[odd.template]
        assert not t.violations(dict(odd.params), arch, dict(odd.dtypes), dict(odd.dims)), str(odd)
        assert "__global__" in source_for(TABLES["rmsnorm"], odd)
    c = kf.explain((37, n), dt["x"], dt["w"], arch=arch, out_dtype="float32" if dt["x"] != "float32" else "bfloat16",
                   **kw)
    assert c.path == "torch" and "out_dtype" in c.reason, str(c)
    if residual:  # a residual dtype no cell of the variant has
        searched = {(dict(v.dtypes)["x"], dict(v.dtypes).get("residual")) for v in VARIANTS}
        other = next(d for d in ("float16", "bfloat16", "float32") if (dt["x"], d) not in searched)
        c = kf.explain((37, n), dt["x"], dt["w"], arch=arch, **{**kw, "residual": other})
        assert c.path == "torch" and f"residual {short(other)}" in c.reason, str(c)
    have = {_variant(v) for v in TABLES["rmsnorm"].entries}
    missing = next(k for k in [(r, "", b, s) for r in ("", dt["x"]) for b in (0, 1) for s in (0, 1)]
                   if k not in have and k != PLAIN and k[1:] != ("", 0, 1))  # store_rstd alone keeps the plain kernel
    c = kf.explain((37, n), dt["x"], dt["w"], arch=arch, residual=missing[0] or False, bias=bool(missing[2]),
                   store_rstd=bool(missing[3]))
    assert c.path == "torch" and f"{describe(missing)}: no exported cell has this variant" in c.reason, str(c)


@pytest.mark.skipif("rmsnorm_bwd" not in TABLES, reason="no backward run exported")
def test_backward_explain_on_and_off_the_table():
    arch = _arch()
    table = TABLES["rmsnorm_bwd"]
    e = table.entries[0]
    (m, n), dt, wdt = _shape(e), dict(e.dtypes)["x"], dict(e.dtypes)["w"]
    on = kf.explain((m, n), dt, wdt, op="rmsnorm_bwd", arch=arch)
    assert (on.path, on.build, on.source_cell) == ("table", e.build, e.cell), str(on)
    other_m = kf.explain((m + 3, n), dt, wdt, op="rmsnorm_bwd", arch=arch)
    assert (other_m.path, other_m.build) == ("table-build", e.build), str(other_m)
    searched_n = {dict(x.dims)["N"] for x in table.entries}
    new_n = next(k for k in (12288, 24576, 6144, 3072) if k not in searched_n)
    off = kf.explain((m, new_n), dt, wdt, op="rmsnorm_bwd", arch=arch)
    assert off.path in ("rerender", "repaired") and dict(off.consts) == {"N": new_n} and not off.build, str(off)
    odd = kf.explain((37, 1001), dt, wdt, op="rmsnorm_bwd", arch=arch)  # no vectorized genome divides 1001
    assert odd.path in ("repaired", "torch"), str(odd)
    if odd.path == "repaired":
        assert dict(odd.params)["vec"] == 1 and "->" in odd.reason
    c = kf.explain((m, n), dt, wdt, op="rmsnorm_bwd", dout_dtype="float32", arch=arch)
    assert c.path == "torch" and "dout" in c.reason, str(c)


@pytest.mark.parametrize("op", OPS)
def test_another_arch_compiles_instead_of_loading_the_prebuilt_cubin(op):
    e = (PLAIN_ENTRIES[op] or TABLES[op].entries)[0]
    c = choose(op, e.dims, e.dtypes, 100)
    assert c.path in ("rerender", "repaired", "torch") and not c.build, str(c)


def test_torch_api_on_cpu_tensors_is_the_float32_fallback_with_autograd():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=g, dtype=torch.float64).float().requires_grad_(True)
    w = (1 + 0.1 * torch.randn(64, generator=g)).requires_grad_(True)
    kf.rmsnorm(x, w, eps=1e-6).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    (x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64).sum().backward()
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-5) and torch.allclose(w.grad.double(), w64.grad, atol=1e-5)
    assert kf.stats()["rmsnorm"]["torch"] >= 1 and kf.stats()["rmsnorm_bwd"]["torch"] >= 1
    y64 = kf.rmsnorm(x64.detach(), w64.detach(), eps=1e-6)  # float64 is computed in float64
    assert y64.dtype == torch.float64
    assert torch.allclose(y64, x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64, atol=1e-12)
    out, res_out = kf.rmsnorm(x.detach(), w.detach(), residual=torch.ones_like(x), prenorm=True)
    assert torch.equal(res_out, x.detach() + 1) and out.shape == x.shape


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_the_backward_rstd_matches_float64(dtype):
    """The rstd autograd's backward computes where no forward kernel stored it, per row, against
    float64; a row of zeros gives rsqrt(eps)."""
    torch = pytest.importorskip("torch")
    from kf_pkg import reference

    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(7, 1000, generator=g, dtype=torch.float64)).to(getattr(torch, dtype))
    x[4] = 0
    got = reference.rstd(x, 1e-6)
    want = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    assert got.shape == (7,) and got.dtype == (torch.float64 if dtype == "float64" else torch.float32)
    assert torch.allclose(got.double(), want, rtol=1e-12 if dtype == "float64" else 1e-6, atol=0)
    assert got[4].item() == pytest.approx(1e3, rel=1e-6)


def test_eager_calls_take_the_autograd_function():
    """Outside torch.compile the plain op runs as an autograd.Function (cheaper to call than the custom op) with
    float64's gradients, and rmsnorm_bwd's API gives the same dx, dw."""
    torch = pytest.importorskip("torch")

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 256, generator=g).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(256, generator=g)).requires_grad_(True)
    dy = torch.randn(6, 256, generator=g)
    y = kf.rmsnorm(x, w, eps=1e-6)
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "_ForwardBackward"
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    y64 = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert torch.allclose(y.detach().double(), y64.detach(), atol=1e-5)
    assert torch.allclose(dx.double(), dx64, atol=1e-5) and torch.allclose(dw.double(), dw64, atol=1e-4)
    r = torch.rsqrt(x.detach().square().mean(-1) + 1e-6)
    bdx, bdw, _, _ = kf.rmsnorm_bwd(x.detach(), w.detach(), dy, r)
    assert torch.allclose(bdx.double(), dx64, atol=1e-5) and torch.allclose(bdw.double(), dw64, atol=1e-4)


def test_the_bench_tables_are_the_exported_matrix_cells():
    """bench's tables: forward and train the matrix's plain cells, residual its residual cells without bias or rstd,
    backward the backward op's cells, serving and serving_residual their named matrices' cells (in no other table);
    a cell's searched entry found by its dtypes and dims."""
    pytest.importorskip("torch")
    from kf_pkg.bench import SERVING, table_cells

    fwd = TABLES.get("rmsnorm")
    if fwd is not None:
        plain = [c for c in fwd.cells if set(dict(c.dtypes)) == {"x", "w"} and c.matrix not in SERVING and not any(
            v for k, v in c.dims if k not in ("M", "N"))]
        assert table_cells("forward") == plain and plain
        for t in SERVING:
            assert table_cells(t) == [c for c in fwd.cells if c.matrix == t]
        assert all("residual" in dict(c.dtypes) for c in table_cells("residual"))
        assert table_cells("train") == (plain if "rmsnorm_bwd" in TABLES else [])
        for e in fwd.entries:
            c = next((c for c in fwd.cells if c.label == e.cell), None)
            assert c is None or fwd.entry(c) == e
    if "rmsnorm_bwd" in TABLES:
        assert table_cells("backward") == list(TABLES["rmsnorm_bwd"].cells)


def test_torch_compile_traces_the_custom_op_forward_and_backward_in_one_graph():
    """torch.compile traces rmsnorm as the custom op (Dynamo's graph holds it, not the autograd.Function), and with
    aot_eager (AOTAutograd with fake tensors, no code generation) its backward too, in one graph, with the eager
    path's values and gradients."""
    torch = pytest.importorskip("torch")

    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 256, generator=g).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(256, generator=g)).requires_grad_(True)
    dy = torch.randn(6, 256, generator=g)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch.compile(lambda a, b: kf.rmsnorm(a, b, eps=1e-6), backend=record, fullgraph=True)(x, w)
    assert len(graphs) == 1 and f"{kf.__name__}.rmsnorm_fwd" in graphs[0] and "_Forward" not in graphs[0], graphs
    compiled = torch.compile(lambda a, b: kf.rmsnorm(a, b, eps=1e-6), backend="aot_eager", fullgraph=True)
    y = compiled(x, w)
    got = torch.autograd.grad(y, (x, w), dy)
    y_eager = kf.rmsnorm(x, w, eps=1e-6)
    want = torch.autograd.grad(y_eager, (x, w), dy)
    assert torch.allclose(y, y_eager) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))


def test_custom_op_schema_fake_and_autograd_registration():
    torch = pytest.importorskip("torch")
    import kf_pkg.ops  # noqa: F401  (registers the ops)

    ns = getattr(torch.ops, kf.__name__)
    result = torch.library.opcheck(ns.rmsnorm_fwd.default, (torch.randn(4, 64), torch.randn(64), 1e-6))
    assert all(v == "SUCCESS" for v in result.values()), result
    x, w, dout = torch.randn(4, 64), torch.randn(64), torch.randn(4, 64)
    r = torch.rsqrt(x.square().mean(-1) + 1e-6)
    result = torch.library.opcheck(ns.rmsnorm_bwd.default, (x, w, dout, r))
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("path,kernel", [("rerender", "right"), ("rerender", "wrong"), ("rerender", "no-compile"),
                                         ("table", "wrong")])
def test_a_kernel_is_checked_on_first_use_and_dropped_when_wrong(path, kernel, op):
    torch = pytest.importorskip("torch")
    from kf_pkg import reference, run
    from kf_pkg.loader import CompileError

    e = (PLAIN_ENTRIES[op] or TABLES[op].entries)[0]
    n = dict(e.dims)["N"]
    x = torch.randn(9, n).to(getattr(torch, dict(e.dtypes)["x"]))
    w = (1 + 0.1 * torch.randn(n)).to(getattr(torch, dict(e.dtypes)["w"]))
    dout = torch.randn_like(x)
    r = reference.rstd(x, 1e-6)
    dts = tuple((k, v) for k, v in e.dtypes if k in ("x", "w"))
    c = kf.Choice(op, path, (("M", 9), ("N", n)), dts, 90, "test", e.template, e.params)
    calls = []

    def fake_launch(choice, tensors, scalars):  # stands in for the GPU: writes the outputs as a kernel would
        calls.append(choice)
        if kernel == "no-compile":
            raise CompileError("NVRTC failed for sm_90a: test")
        off = 0 if kernel == "right" else 1
        if op == "rmsnorm":
            tensors["y"].copy_(reference.forward_2d(tensors["x"], tensors["w"], scalars["eps"]) + off)
        else:
            dx, dw = reference.backward_2d(tensors["x"], tensors["w"], tensors["dout"], tensors["rstd"])
            tensors["dx"].copy_(dx)
            tensors["dw"].copy_(dw + off)  # a wrong dw alone must be caught too

    rt = run.Runtime()
    rt.choice = lambda op_, x_, w_: c
    rt.launcher.run = fake_launch

    def call():
        return (rt.forward(x, w, 1e-6),) if op == "rmsnorm" else rt.backward(x, w, dout, r)

    want = (reference.forward_2d(x, w, 1e-6),) if op == "rmsnorm" else reference.backward_2d(x, w, dout, r)
    if kernel == "right":  # the probe (its class's M is 9 itself, on fresh rows), then both calls
        assert all(torch.equal(a, b) for a, b in zip(call(), want))
        assert all(torch.equal(a, b) for a, b in zip(call(), want))
        assert rt.counts[(op, path)] == 2 and len(calls) == 3 and calls[0].dims == c.dims
    else:  # the probe fails: the call never launches
        with pytest.warns(RuntimeWarning, match="first-use check at .*takes the torch fp32 path"):
            assert all(torch.equal(a, b) for a, b in zip(call(), want))
        assert all(torch.equal(a, b) for a, b in zip(call(), want))
        assert rt.counts[(op, "torch")] == 2 and len(calls) == 1  # not launched again


@pytest.mark.parametrize("op", OPS)
def test_every_searched_cell_has_a_probe_shape_its_template_admits(op):
    """The first-use check's shape for a cell's class: M by its class, the rest as the cell's; legal for the
    template, so a table kernel is probed at a small M rather than checked on a caller's whole call."""
    from kf_pkg.choose import probe_dims
    from kf_pkg.firstuse import PROBE_TILE

    for e in TABLES[op].entries:
        c = choose(op, e.dims, e.dtypes, TABLES[op].arch_number)
        d, p = dict(c.dims), dict(probe_dims(c))
        assert {k: v for k, v in p.items() if k != "M"} == {k: v for k, v in d.items() if k != "M"}
        assert p["M"] == d["M"] if d["M"] <= PROBE_TILE else PROBE_TILE <= p["M"] < 2 * PROBE_TILE
        assert p["M"] % PROBE_TILE == d["M"] % PROBE_TILE
        assert TABLES[op].templates[c.template].violations(dict(c.params), c.arch, dict(c.dtypes), p) == [], e.cell


@pytest.mark.parametrize("op", OPS)
def test_each_shape_class_is_probed_once_at_its_own_small_m(op, monkeypatch):
    """M 1000 and 1064 share a class (probed at M 104 = 64 + 1000 mod 64), M 1001 is another (105), M 9 its own;
    the probe draws its inputs afresh and its eps from a range; <PACKAGE>_SELFCHECK=0 turns probing off."""
    torch = pytest.importorskip("torch")
    from kf_pkg import reference, run
    from kf_pkg.firstuse import reduced

    e = (PLAIN_ENTRIES[op] or TABLES[op].entries)[0]
    n, dts = dict(e.dims)["N"], tuple((k, v) for k, v in e.dtypes if k in ("x", "w"))
    xdt, wdt = getattr(torch, dict(e.dtypes)["x"]), getattr(torch, dict(e.dtypes)["w"])
    launched, eps = [], set()

    def fake_launch(choice, tensors, scalars):
        launched.append(dict(choice.dims)["M"])
        if op == "rmsnorm":
            eps.add(scalars["eps"])
            tensors["y"].copy_(reference.forward_2d(tensors["x"], tensors["w"], scalars["eps"]))
        else:
            dx, dw = reference.backward_2d(tensors["x"], tensors["w"], tensors["dout"], tensors["rstd"])
            tensors["dx"].copy_(dx)
            tensors["dw"].copy_(dw)

    rt = run.Runtime()
    rt.launcher.run = fake_launch
    rt.choice = lambda op_, x_, w_: kf.Choice(op, "table", (("M", x_.shape[0]), ("N", n)), dts, 90, "test",
                                               e.template, e.params)
    w = (1 + 0.1 * torch.randn(n)).to(wdt)
    for m in (1000, 1064, 1001, 9, 1000):
        x = torch.randn(m, n).to(xdt)
        if op == "rmsnorm":
            rt.forward(x, w, 1e-6)
        else:
            rt.backward(x, w, torch.randn_like(x), reference.rstd(x, 1e-6))
    assert [reduced(m) for m in (1000, 1001)] == [104, 105]
    assert launched == [104, 1000, 1064, 105, 1001, 9, 9, 1000]
    drawn = eps - {1e-6}  # the calls' own eps, and one drawn per probe
    assert op != "rmsnorm" or (len(drawn) == 3 and all(1e-6 <= x <= 1e-4 for x in drawn))
    monkeypatch.setenv(f"{kf.__name__.upper()}_SELFCHECK", "0")
    rt2 = run.Runtime()
    rt2.launcher.run, rt2.choice, launched[:] = fake_launch, rt.choice, []
    x = torch.randn(1000, n).to(xdt)
    if op == "rmsnorm":
        rt2.forward(x, w, 1e-6)
    else:
        rt2.backward(x, w, torch.randn_like(x), reference.rstd(x, 1e-6))
    assert launched == [1000]


def test_provenance_names_the_runs():
    p = kf.provenance()
    assert set(p["ops"]) == set(OPS)
    for op, t in TABLES.items():
        assert p["ops"][op]["run"]["run_id"] == t.run_id
        runs = p["ops"][op].get("runs", [p["ops"][op]])  # several runs merged into one table: each named
        assert tuple(r["run"]["run_id"] for r in runs) == t.run_ids
        assert all(k["cubin_from"] in ("store", "compiled") for k in p["ops"][op]["kernels"].values())


def test_variant_custom_op_schema_and_autograd_on_cpu_match_float64():
    """The variant custom op (CPU tensors take its torch path) and its backward (rmsnorm_bwd on h,
    dresidual = dh + dresidual_out, db = column sum of dy) against float64 autograd."""
    torch = pytest.importorskip("torch")
    import kf_pkg.ops  # noqa: F401  (registers the ops)

    ns = getattr(torch.ops, kf.__name__)
    g = torch.Generator().manual_seed(3)
    x, res = torch.randn(6, 64, generator=g), torch.randn(6, 64, generator=g)
    w, b = 1 + 0.1 * torch.randn(64, generator=g), torch.randn(64, generator=g)
    for args in [(x, w, res, None, 1e-6, False), (x, w, None, b, 1e-6, True), (x, w, res, b, 1e-6, True)]:
        result = torch.library.opcheck(ns.rmsnorm_fwd_variant.default, args)
        assert all(v == "SUCCESS" for v in result.values()), result
    leaves = [t.clone().requires_grad_(True) for t in (x, w, res, b)]
    out, res_out, r = ns.rmsnorm_fwd_variant(leaves[0], leaves[1], leaves[2], leaves[3], 1e-6, True)
    dy, dro = torch.randn(6, 64, generator=g), torch.randn(6, 64, generator=g)
    torch.autograd.backward([out, res_out], [dy, dro])
    ref = [t.double().requires_grad_(True) for t in (x, w, res, b)]
    h = ref[0] + ref[2]
    r64 = torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)
    y = h * r64 * ref[1] + ref[3]
    torch.autograd.backward([y, h], [dy.double(), dro.double()])
    assert torch.allclose(out.double(), y, atol=1e-5) and torch.allclose(res_out.double(), h, atol=1e-6)
    assert torch.allclose(r.double(), r64.squeeze(-1), atol=1e-6)
    for got, want in zip(leaves, ref):
        assert torch.allclose(got.grad.double(), want.grad, atol=1e-4), (got.grad - want.grad).abs().max()


@pytest.mark.parametrize("residual, bias, store_rstd, prenorm", [(True, False, False, True), (False, True, True, False),
                                                             (True, True, True, True), (True, False, False, False)])
def test_eager_variant_calls_take_the_autograd_function(residual, bias, store_rstd, prenorm):
    """Outside torch.compile the variant op runs as an autograd.Function (its torch path on CPU tensors) with
    float64's values and gradients, residual_out's gradient added where it is used (prenorm), none made where not;
    rstd is stored and needs no gradient. torch.compile traces the variant custom op instead, with the same
    gradients (aot_eager)."""
    torch = pytest.importorskip("torch")
    from kf_pkg import ops

    g = torch.Generator().manual_seed(5)
    x, res = torch.randn(6, 128, generator=g), torch.randn(6, 128, generator=g)
    w, b = 1 + 0.1 * torch.randn(128, generator=g), torch.randn(128, generator=g)
    dy, dro = torch.randn(6, 128, generator=g), torch.randn(6, 128, generator=g)
    picked = (x, w, res if residual else None, b if bias else None)

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) if t is not None else None for t in picked]
        out, res_out, r = fn(*leaves, 1e-6, store_rstd)
        outs, seeds = ([out, res_out], [dy, dro]) if prenorm and residual else ([out], [dy])
        torch.autograd.backward(outs, seeds)
        return out, res_out, r, [t.grad if t is not None else None for t in leaves]

    out, res_out, r, got = grads(ops.variant)
    assert type(out.grad_fn).__name__ == "_VariantBackward" and not r.requires_grad
    assert r.shape == ((6,) if store_rstd else (0,)) and res_out.shape == ((6, 128) if residual else (0,))
    ref = [t.double().requires_grad_(True) if t is not None else None for t in picked]
    h = ref[0] + ref[2] if residual else ref[0]
    r64 = torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)
    y = h * r64 * ref[1] + (ref[3] if bias else 0)
    torch.autograd.backward([y, h] if prenorm and residual else [y],
                            [dy.double(), dro.double()] if prenorm and residual else [dy.double()])
    assert torch.allclose(out.double(), y, atol=1e-5)
    if residual:
        assert torch.allclose(res_out.double(), h, atol=1e-6)
    if store_rstd:
        assert torch.allclose(r.double(), r64.squeeze(-1), atol=1e-6)
    for mine, want in zip(got, ref):
        assert (mine is None) == (want is None)
        if want is not None:
            assert torch.allclose(mine.double(), want.grad, atol=1e-4), (mine - want.grad).abs().max()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch.compile(ops.variant, backend=record, fullgraph=True)(*picked, 1e-6, store_rstd)
    assert len(graphs) == 1 and f"{kf.__name__}.rmsnorm_fwd_variant" in graphs[0] and "_Variant" not in graphs[0]
    compiled = grads(torch.compile(ops.variant, backend="aot_eager", fullgraph=True))
    for mine, theirs in zip(got, compiled[3]):
        assert (mine is None) == (theirs is None) and (mine is None or torch.allclose(mine, theirs, atol=1e-5))


def test_an_eager_variant_call_whose_y_is_unused_passes_residual_outs_gradient_through():
    """Only residual_out used (y dropped): the Function's backward gets no dy (gradients are not materialized) and
    takes it as zeros: dx = dresidual = dresidual_out, dw = 0."""
    torch = pytest.importorskip("torch")
    from kf_pkg import ops

    g = torch.Generator().manual_seed(6)
    x, res = torch.randn(5, 64, generator=g).requires_grad_(True), torch.randn(5, 64, generator=g).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(64, generator=g)).requires_grad_(True)
    dro = torch.randn(5, 64, generator=g)
    _, res_out, _ = ops.variant(x, w, res, None, 1e-6, False)
    dx, dw, dres = torch.autograd.grad(res_out, (x, w, res), dro)
    assert torch.equal(dx, dro) and torch.equal(dres, dro) and torch.count_nonzero(dw) == 0


@pytest.mark.parametrize("kernel", ["right", "wrong"])
def test_an_unchecked_variant_kernel_is_checked_on_first_use_and_dropped_when_wrong(kernel):
    torch = pytest.importorskip("torch")
    if not VARIANTS:
        pytest.skip("no variant cell exported")
    from kf_pkg import reference, run

    e = VARIANTS[0]
    residual, _, bias, store_rstd = _variant(e)
    dt, n = dict(e.dtypes), dict(e.dims)["N"]
    x = torch.randn(9, n).to(getattr(torch, dt["x"]))
    w = (1 + 0.1 * torch.randn(n)).to(getattr(torch, dt["w"]))
    res = torch.randn(9, n).to(getattr(torch, residual)) if residual else None
    b = torch.randn(n).to(w.dtype) if bias else None
    dims = tuple(sorted({**dict(e.dims), "M": 9}.items()))
    c = kf.Choice("rmsnorm", "rerender", dims, e.dtypes, 90, "test", e.template, e.params)
    calls = []

    def fake_launch(choice, tensors, scalars):  # stands in for the GPU: writes the outputs as the kernel would
        calls.append(sorted(tensors))
        y, ro, r = reference.rmsnorm_fwd(tensors["x"], tensors["w"], tensors.get("bias"), tensors.get("residual"),
                                         None, None, scalars["eps"], True)
        tensors["y"].copy_(y + (0 if kernel == "right" else 1))
        if "residual_out" in tensors:
            tensors["residual_out"].copy_(ro)
        if "rstd" in tensors:
            tensors["rstd"].copy_(r)

    rt = run.Runtime()
    rt.variant_choice = lambda *a: c
    rt.launcher.run = fake_launch
    want = reference.rmsnorm_fwd(x, w, b, res, None, None, 1e-6, bool(store_rstd))
    expected = {"x", "w", "y"} | ({"residual", "residual_out"} if residual else set()) | ({"bias"} if bias else set()) \
        | ({"rstd"} if store_rstd else set())
    if kernel == "right":  # the probe (M 9: its own class) binds what the call binds
        got = rt.forward_variant(x, w, res, b, 1e-6, bool(store_rstd))
        assert torch.equal(got[0], want[0]) and calls == [sorted(expected)] * 2
        assert rt.counts[("rmsnorm", "rerender")] == 1
    else:
        with pytest.warns(RuntimeWarning, match="takes the torch fp32 path"):
            got = rt.forward_variant(x, w, res, b, 1e-6, bool(store_rstd))
        assert torch.equal(got[0], want[0]) and len(calls) == 1
        rt.forward_variant(x, w, res, b, 1e-6, bool(store_rstd))
        assert rt.counts[("rmsnorm", "torch")] == 2 and len(calls) == 1  # not launched again
    if residual:
        assert torch.equal(got[1], want[1])


def test_a_training_call_stores_rstd_in_the_forward_and_its_backward_reads_it():
    """Outside torch.compile, a forward that needs gradients asks for the store_rstd kernel where one serves the call;
    the backward then takes the rstd that kernel wrote (here a fake kernel's, marked), recomputing nothing. Without
    such a kernel (or without gradients) the plain forward runs and the backward recomputes rstd."""
    torch = pytest.importorskip("torch")
    from kf_pkg import ops, reference, run

    e = (PLAIN_ENTRIES.get("rmsnorm") or [None])[0]
    if e is None:
        pytest.skip("no plain forward cell exported")
    n = dict(e.dims)["N"]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, n, generator=g).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(n, generator=g)).requires_grad_(True)
    dy = torch.randn(7, n, generator=g)
    dims = (("M", 7), ("N", n), ("store_rstd", 1))
    dts = tuple((k, v) for k, v in e.dtypes if k in ("x", "w"))
    c = kf.Choice("rmsnorm", "rerender", dims, dts, 90, "test", e.template, e.params)
    mark = 1.25  # the fake kernel's rstd is the true one times this: the backward must see it
    launched, seen = [], []

    def fake_launch(choice, tensors, scalars):
        launched.append(sorted(tensors))
        y, _, r = reference.rmsnorm_fwd(tensors["x"], tensors["w"], None, None, None, None, scalars["eps"], True)
        tensors["y"].copy_(y)
        tensors["rstd"].copy_(r * mark)

    rt = run.Runtime()
    rt.variant_choice = lambda *a: c
    rt.launcher.run = fake_launch
    rt.selfcheck = False  # no probe: the fake kernel's rstd is marked on purpose
    rt.backward = lambda x_, w_, dout, r: seen.append(r.clone()) or reference.backward_2d(x_, w_, dout, r)
    real = run.runtime
    try:
        ops.runtime = lambda: rt
        y = ops.forward(x, w, 1e-6)
        torch.autograd.grad(y, (x, w), dy)
        want = torch.rsqrt(x.detach().float().square().mean(-1) + 1e-6)
        assert launched == [["rstd", "w", "x", "y"]] and torch.allclose(seen[0], want * mark)
        with torch.no_grad():  # no gradients: the plain forward (rt.forward), nothing stored
            rt.forward = lambda x_, w_, eps: reference.forward_2d(x_, w_, eps)
            ops.forward(x, w, 1e-6)
        assert len(launched) == 1
        rt.variant_choice = lambda *a: kf.Choice("rmsnorm", "torch", dims, dts, 90, "no store_rstd kernel")
        y = ops.forward(x, w, 1e-6)
        torch.autograd.grad(y, (x, w), dy)
        assert len(launched) == 1 and torch.allclose(seen[1], want)  # recomputed
    finally:
        ops.runtime = real


def test_a_store_rstd_call_without_its_cells_takes_the_plain_genomes_whose_template_stores_rstd():
    """store_rstd alone, with no store_rstd cell exported: the pool is the plain cells whose template specializes on
    store_rstd and binds rstd (rendered with the switch on); none such, or another variant: no pool, and why."""
    from types import SimpleNamespace as NS

    from kf_pkg import choose

    def launches(*args):
        return (NS(args=args),)

    dts = (("w", "bfloat16"), ("x", "bfloat16"))
    table = NS(templates={"stores": NS(specialize=("N", "store_rstd"), launches=launches("x", "w", "y", "rstd?", "M")),
                          "plain": NS(specialize=("N",), launches=launches("x", "w", "y", "M"))},
               entries=[NS(template="plain", dtypes=dts, dims=(("M", 4096), ("N", 1024))),
                        NS(template="stores", dtypes=dts, dims=(("M", 4096), ("N", 8192)))])
    want_dt = dict(dts)
    pool, why = choose._pool(table, {"M": 64, "N": 1024, "store_rstd": 1}, want_dt)
    assert [e.template for e in pool] == ["stores"] and why == ""
    pool, why = choose._pool(table, {"M": 64, "N": 1024, "bias": 1}, want_dt)
    assert pool == [] and "no exported cell has this variant" in why
    table.entries = table.entries[:1]  # no template that stores rstd
    pool, why = choose._pool(table, {"M": 64, "N": 1024, "store_rstd": 1}, want_dt)
    assert pool == [] and "store_rstd" in why
    rstd_cell = NS(template="plain", dtypes=dts, dims=(("M", 4096), ("N", 1024), ("store_rstd", 1)))
    table.entries.append(rstd_cell)  # a store_rstd cell exported: its own variant serves the call
    assert choose._pool(table, {"M": 64, "N": 1024, "store_rstd": 1}, want_dt)[0] == [rstd_cell]


def test_a_call_writes_into_the_tensors_it_is_given_and_refuses_ones_that_cannot_take_it():
    """rmsnorm_fwd(..., out=, residual_out=): the call's outputs written into those tensors and returned (the same
    objects), equal to a call without them; a wrong shape, dtype or layout, memory shared with an input, or a
    residual_out without a residual is one ValueError naming what is wrong."""
    torch = pytest.importorskip("torch")

    g = torch.Generator().manual_seed(8)
    x, res = torch.randn(5, 256, generator=g), torch.randn(5, 256, generator=g)
    w = 1 + 0.1 * torch.randn(256, generator=g)
    want = kf.rmsnorm_fwd(x, w, residual=res)
    out, rout = torch.full_like(x, float("nan")), torch.full_like(res, float("nan"))
    got = kf.rmsnorm_fwd(x, w, residual=res, out=out, residual_out=rout)
    assert got[0] is out and got[1] is rout and torch.equal(out, want[0]) and torch.equal(rout, want[1])
    plain = torch.empty_like(x)
    assert kf.rmsnorm_fwd(x, w, out=plain)[0] is plain and torch.equal(plain, kf.rmsnorm_fwd(x, w)[0])
    for bad, words in [(torch.empty(5, 255), "needs a contiguous (5, 256) torch.float32"),
                       (torch.empty(5, 256, dtype=torch.float16), "got (5, 256) torch.float16"),
                       (torch.empty(256, 5).t(), "not contiguous"), (x, "shares memory with an input")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            kf.rmsnorm_fwd(x, w, out=bad)
    with pytest.raises(ValueError, match="residual_out: a call without a residual writes none"):
        kf.rmsnorm_fwd(x, w, residual_out=rout)
    with pytest.raises(ValueError, match="residual_out: shares memory with an input"):
        kf.rmsnorm_fwd(x, w, residual=res, residual_out=res)


def test_a_direct_launch_serves_only_once_its_outputs_are_the_routed_calls():
    """Before a signature is served by its direct launch, the launch runs once on the learning call's inputs and
    must give that call's outputs bit for bit (NaN included): a raw driver launch that does not falls back to
    cuda.core's launch, checked again; a launch that still does not is dropped with a warning; the check's launches
    count as no call."""
    torch = pytest.importorskip("torch")
    import ctypes

    from kf_pkg import api

    g = torch.Generator().manual_seed(9)
    x, res = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    w = 1 + 0.1 * torch.randn(64, generator=g)
    y, rout = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    y[1, 3] = float("nan")

    class Fake:
        """A launch writing `outs` (or `outs` + 1 where wrong) through the output pointers it is passed."""

        def __init__(self, outs, raw_right: bool, core_right: bool):
            self.outs, self.right, self.raw, self.calls = outs, (raw_right, core_right), True, 0

        def use_cuda_core(self):
            self.raw = False

        def __call__(self, *values):
            self.calls += 1
            right = self.right[0] if self.raw else self.right[1]
            dsts = (values[2],) if len(values) == 4 else (values[2], values[4])  # y; y and residual_out
            for src, dst in zip(self.outs, dsts):
                out = src if right else src + 1
                ctypes.memmove(dst, out.data_ptr(), out.numel() * out.element_size())

    for residual, outs in ((None, (y, None)), (res, (y, rout))):
        ok = Fake(outs, raw_right=True, core_right=True)
        assert api._checked(ok, x, w, residual, 1e-6, outs) is ok and ok.raw and ok.calls == 0
        fell = Fake(outs, raw_right=False, core_right=True)
        assert api._checked(fell, x, w, residual, 1e-6, outs) is fell and not fell.raw and fell.calls == 0
        bad = Fake(outs, raw_right=False, core_right=False)
        with pytest.warns(RuntimeWarning, match="disagreed with the routed call"):
            assert api._checked(bad, x, w, residual, 1e-6, outs) is None


def test_the_bench_times_the_cuda_core_launch_beside_the_default_one(monkeypatch):
    """package.cuda_core: the package's call with the runtime's direct launch of its signature swapped for a copy
    launching by cuda.core around each call, and put back after; absent, saying why, where the signature has no
    direct launch through libcuda."""
    pytest.importorskip("torch")
    import kf_pkg.bench as bench
    from kf_pkg.launch import Direct

    class Runtime:
        fast: dict = {}

    monkeypatch.setattr(bench, "runtime", lambda: Runtime)
    seen = []
    assert "no direct launch through libcuda" in bench.cuda_core_side(lambda: seen.append(1), ("sig",))
    d = object.__new__(Direct)
    d._raw, d.calls = object(), 0
    Runtime.fast = {("sig",): d}

    def call():
        got = Runtime.fast[("sig",)]
        seen.append(got.raw)
        return got

    swapped = bench.cuda_core_side(call, ("sig",))
    assert callable(swapped) and seen[-1] is True  # the side's first call: the default launch, learning it
    used = swapped()
    assert used is not d and not used.raw and seen[-1] is False and Runtime.fast[("sig",)] is d and d.raw

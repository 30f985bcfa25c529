"""The package on any machine (no GPU, no torch needed): its data is whole and consistent, its renderer
gives back the shipped sources, and explain() names a path for table and off-table shapes."""

from __future__ import annotations

import hashlib
import json

import kf_pkg as kf
import pytest
from kf_pkg.choose import choose
from kf_pkg.expr import DATA

TABLES = kf.tables()
BUILDS = [(op, b) for op, t in TABLES.items() for b in t.builds.values()]
ENTRIES = [(op, e) for op, t in TABLES.items() for e in t.entries]


def test_files_are_there_and_match_their_hashes():
    doc = json.loads((DATA / "dispatch.json").read_text())
    assert TABLES and "rmsnorm" in TABLES
    for op, t in doc["ops"].items():
        assert t["entries"], op
        for b in t["builds"].values():
            assert hashlib.sha256((DATA / b["cu"]).read_bytes()).hexdigest() == b["cu_sha256"]
            assert hashlib.sha256((DATA / b["cubin"]).read_bytes()).hexdigest() == b["cubin_sha256"]
        for tid, tm in t["templates"].items():
            assert (DATA / tm["file"]).exists(), tid


@pytest.mark.parametrize("op,build", BUILDS, ids=[f"{op}-{b.id}" for op, b in BUILDS])
def test_renderer_gives_back_the_shipped_source(op, build):
    t = TABLES[op].templates[build.template]
    src = t.render(dict(build.params), TABLES[op].arch_number, dict(build.dtypes), dict(build.consts))
    assert src == (DATA / build.cu).read_text()


@pytest.mark.parametrize("op,entry", ENTRIES, ids=[f"{op}-{e.cell}" for op, e in ENTRIES])
def test_every_searched_cell_takes_its_table_kernel(op, entry):
    c = choose(op, entry.dims, entry.dtypes, TABLES[op].arch_number)
    assert (c.path, c.build, c.template, c.params) == ("table", entry.build, entry.template, entry.params), str(c)
    launches, _ = TABLES[op].templates[c.template].plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))
    assert launches and all(ln.grid[0] >= 1 and 32 <= ln.block[0] <= 1024 for ln in launches)
    assert all(a.partition(":")[0] in {t.name for t in TABLES[op].tensors} | dict(entry.dims).keys()
               | dict(TABLES[op].scalars).keys() | dict(TABLES[op].templates[c.template].workspaces).keys()
               for ln in launches for a in ln.args)


def test_off_table_shapes_get_a_named_path():
    arch = TABLES["rmsnorm"].arch_number
    for shape in [(1, 1000), (37, 4100), (3, 33), (7, 5, 3072), (2, 262144)]:
        c = kf.explain(shape, "bfloat16", arch=arch)
        assert c.path in kf.PATHS and c.path != "table" and c.reason, str(c)
        assert str(c).startswith("rmsnorm ")


def test_variants_the_kernels_do_not_compute_say_torch():
    arch = TABLES["rmsnorm"].arch_number
    e = TABLES["rmsnorm"].entries[0]
    shape, dt = (dict(e.dims)["M"], dict(e.dims)["N"]), dict(e.dtypes)["x"]
    assert kf.explain(shape, dt, arch=arch).path == "table"
    for kw, word in [({"bias": True}, "bias"), ({"residual": True}, "residual"),
                     ({"out_dtype": "float32" if dt != "float32" else "bfloat16"}, "out_dtype")]:
        c = kf.explain(shape, dt, arch=arch, **kw)
        assert c.path == "torch" and word in c.reason, str(c)
    assert "ones" in str(kf.explain(shape, dt, arch=arch, weight=False))


def test_another_arch_compiles_instead_of_loading_the_prebuilt_cubin():
    e = TABLES["rmsnorm"].entries[0]
    c = choose("rmsnorm", e.dims, e.dtypes, 100)
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


def test_custom_op_schema_fake_and_autograd_registration():
    torch = pytest.importorskip("torch")
    import kf_pkg.ops  # noqa: F401  (registers the ops)

    op = getattr(torch.ops, kf.__name__).rmsnorm_fwd.default
    result = torch.library.opcheck(op, (torch.randn(4, 64), torch.randn(64), 1e-6))
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("kernel", ["right", "wrong", "no-compile"])
def test_an_unchecked_kernel_is_checked_on_first_use_and_dropped_when_wrong(kernel):
    torch = pytest.importorskip("torch")
    from kf_pkg import reference, run
    from kf_pkg.loader import CompileError

    e = TABLES["rmsnorm"].entries[0]
    x = torch.randn(9, dict(e.dims)["N"]).to(getattr(torch, dict(e.dtypes)["x"]))
    w = torch.ones(x.shape[1], dtype=getattr(torch, dict(e.dtypes)["w"]))
    c = kf.Choice("rmsnorm", "rerender", (("M", 9), ("N", x.shape[1])), e.dtypes, 90, "test", e.template, e.params)
    calls = []

    def fake_launch(choice, tensors, scalars):  # stands in for the GPU: writes y as a kernel would
        calls.append(choice)
        if kernel == "no-compile":
            raise CompileError("NVRTC failed for sm_90a: test")
        y = reference.forward_2d(tensors["x"], tensors["w"], scalars["eps"])
        tensors["y"].copy_(y if kernel == "right" else y + 1)

    rt = run.Runtime()
    rt.choice = lambda op, x, w: c
    rt.launcher.run = fake_launch
    want = reference.forward_2d(x, w, 1e-6)
    if kernel == "right":
        assert torch.equal(rt.forward(x, w, 1e-6), want) and torch.equal(rt.forward(x, w, 1e-6), want)
        assert rt.counts[("rmsnorm", "rerender")] == 2 and len(calls) == 2
    else:
        with pytest.warns(RuntimeWarning, match="takes the torch fp32 path"):
            assert torch.equal(rt.forward(x, w, 1e-6), want)
        assert torch.equal(rt.forward(x, w, 1e-6), want)
        assert rt.counts[("rmsnorm", "torch")] == 2 and len(calls) == 1  # not launched again


def test_provenance_names_the_runs():
    p = kf.provenance()
    for op, t in TABLES.items():
        assert p["ops"][op]["run"]["run_id"] == t.run_id

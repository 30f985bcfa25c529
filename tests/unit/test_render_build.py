"""The sandbox, and real NVRTC compiles of every template (no GPU needed)."""

from __future__ import annotations

import pytest

from evo.build import Builder, compile_one, parse_ptxas, prepare
from evo.genome import Genome
from evo.render import render
from evo.status import Status
from evo.template import TemplateError, load_templates, parse_template
from ops.rmsnorm.spec import cell

TEMPLATES = load_templates("rmsnorm")
HEADER = """{#- kfactory
[template]
op = "rmsnorm"
name = "evil"
[space]
threads = [128]
[defaults]
threads = 128
[[launch]]
kernel = "k"
grid = ["M"]
block = ["threads"]
args = ["x"]
-#}
"""


def _tdef(body: str):
    return parse_template(HEADER + body, "test")


@pytest.mark.parametrize("body", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ threads.__class__.__base__.__subclasses__() }}",
    "{% include '/etc/passwd' %}",
    "{{ not_a_param }}",
], ids=["mro", "globals", "subclasses", "include-outside", "undefined-name"])
def test_sandbox_rejects_escapes(body):
    r = render(_tdef(body), {"threads": 128}, 90, {"x": "bfloat16", "w": "bfloat16"}, {})
    assert r.status is Status.RENDER_ERROR
    assert r.source == "" and r.error


def test_header_errors_name_the_problem():
    with pytest.raises(TemplateError, match="no '.*kfactory"):
        parse_template("__global__ void k() {}", "plain.cu.j2")
    with pytest.raises(TemplateError, match=r"\[defaults\].threads"):
        parse_template(HEADER.replace("threads = 128", "threads = 96"), "bad-default")


def _two_points(tdef):
    """The default point and a second, different legal point."""
    p1 = tdef.default_params()
    p2 = dict(p1, threads=256 if p1["threads"] != 256 else 128, vec=4, load_hint="cg", store_hint="cs")
    return p1, p2


CASES = [
    (name, dt, i)
    for name in sorted(TEMPLATES)
    for dt in ("bfloat16", "float16", "float32")
    for i in (0, 1)
]


@pytest.mark.parametrize("name, dt, point", CASES, ids=[f"{n}-{d}-p{i}" for n, d, i in CASES])
def test_every_template_compiles_for_sm90a(name, dt, point):
    tdef = TEMPLATES[name]
    params = _two_points(tdef)[point]
    if dt == "float32":
        params["vec"] = 4
    c = cell(dt, 4096, 4096)
    if name == "cta_row":
        params["threads"] = 256 if point == 0 else 512
    assert tdef.violations(params, 90, c.dtypes_dict(), c.dims_dict()) == []
    g = Genome.make("rmsnorm", name, tdef.source_hash, params)
    r = compile_one(prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
    assert r.status is Status.OK, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF"
    assert 16 <= r.regs <= 255
    assert r.spill_stores == 0
    assert "sm_90a" in r.log


def test_sm100a_compiles_too():
    tdef = TEMPLATES["warp_row"]
    g = Genome.make("rmsnorm", "warp_row", tdef.source_hash, tdef.default_params())
    r = compile_one(prepare(tdef, g, "sm_100a", {"x": "bfloat16", "w": "bfloat16"}, {}))
    assert r.status is Status.OK and "sm_100a" in r.log and r.regs > 0


def test_broken_template_is_compile_error_with_log():
    tdef = _tdef('extern "C" __global__ void k(float* x) { x[0] = undeclared_symbol; }\n')
    g = Genome.make("rmsnorm", "evil", tdef.source_hash, {"threads": 128})
    r = compile_one(prepare(tdef, g, "sm_90a", {"x": "float32", "w": "float32"}, {}))
    assert r.status is Status.COMPILE_ERROR
    assert "undeclared_symbol" in r.log and r.cubin == b""
    assert "error" in r.error.lower()


def test_missing_kernel_is_compile_error():
    tdef = _tdef('extern "C" __global__ void other(float* x) { x[0] = 1.f; }\n')
    g = Genome.make("rmsnorm", "evil", tdef.source_hash, {"threads": 128})
    r = compile_one(prepare(tdef, g, "sm_90a", {"x": "float32", "w": "float32"}, {}))
    assert r.status is Status.COMPILE_ERROR and "'k'" in r.error


def test_resource_error_when_registers_exceed_the_block():
    tdef = parse_template(HEADER.replace("threads = [128]", "threads = [1024]").replace("threads = 128", "threads = 1024")
                          + 'extern "C" __global__ void __launch_bounds__(1024) k(float* x) { x[threadIdx.x] = 1.f; }\n',
                          "big")
    g = Genome.make("rmsnorm", "evil", tdef.source_hash, {"threads": 1024})
    bi = prepare(tdef, g, "sm_90a", {"x": "float32", "w": "float32"}, {})
    assert bi.threads == 1024
    from evo.build import KernelResources, check_resources
    status, why = check_resources({"k": KernelResources(regs=128)}, bi.threads)
    assert status is Status.RESOURCE_ERROR and "128 regs" in why


def test_ptxas_parse():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_90a'\n"
           "ptxas info    : Function properties for a\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem\n")
    r = parse_ptxas(log)["a"]
    assert (r.regs, r.stack_bytes, r.spill_stores, r.spill_loads, r.smem_bytes) == (40, 8, 4, 12, 1024)


def test_builder_caches_by_key():
    tdef = TEMPLATES["warp_row"]
    g = Genome.make("rmsnorm", "warp_row", tdef.source_hash, tdef.default_params())
    bi = prepare(tdef, g, "sm_90a", {"x": "bfloat16", "w": "bfloat16"}, {})
    with Builder(workers=1) as b:
        r1, r2 = b.build([bi, bi])
        assert r1 is r2 and r1.status is Status.OK
    bi2 = prepare(tdef, g, "sm_90a", {"x": "float16", "w": "float16"}, {})
    assert bi2.key() != bi.key()

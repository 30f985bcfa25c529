"""The sandbox, and real NVRTC compiles of every template (no GPU needed)."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import Builder, compile_one, parse_ptxas, prepare
from evo.core.genome import Genome
from evo.templates.render import render
from evo.core.status import Status
from evo.templates.template import TemplateError, load_templates, parse_template
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
    space = dict(tdef.space)
    p2 = dict(p1, threads=256 if p1["threads"] != 256 else 128, vec=4)
    p2 |= {k: v for k, v in (("load_hint", "cg"), ("store_hint", "cs")) if v in space.get(k, ())}
    assert p2 != p1
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
    c = cell(dt, 4096, 4096, residual=name == "cta_row_fused")  # the residual variant's template needs its cell
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
    from evo.build.nvrtc import KernelResources, check_resources
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


def test_build_timeout_is_validated():
    from evo.core.config import BuildSection, ConfigError, parse_config

    assert BuildSection().timeout_s == 60.0
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="build.timeout_s"):
            BuildSection(timeout_s=bad)
        with pytest.raises(ValueError, match="timeout_s"):
            Builder(workers=1, timeout_s=bad)
    assert parse_config('[run]\nop = "rmsnorm"\n[build]\ntimeout_s = 5\n').build.timeout_s == 5.0


# An LLM child whose rendered CUDA reads a file only at rows_per_warp = 4 (the default is 1). Jinja builds
# the directive, so neither the static check nor the check of the rendered defaults can see it.
HIDDEN = ('{% include "_macros/memory.cuh.j2" %}\n'
          '{% if rows_per_warp == 4 %}{{ "#" ~ "include" }} "/etc/passwd"{% endif %}\n')


def test_llm_template_unsafe_only_off_its_defaults_is_refused_at_build_time():
    import random

    from evo.llm.mutate import (
        LLMProposal,
        child_genome,
        proposal_template,
        read_proposal,
    )
    from evo.search.operators import mutate_tile, switch_template
    from tests.unit.fake_llm_server import BF16, parent_request, whole

    req = parent_request()
    status, text, reason = read_proposal(whole(req.template_text.replace(
        '{% include "_macros/memory.cuh.j2" %}\n', HIDDEN, 1)), req)
    assert status is Status.OK, reason  # the LLM gate renders the defaults only
    p = LLMProposal(status, text, reason, "call-1")
    tdef, child = proposal_template(p), child_genome(p)
    assert not tdef.trusted and TEMPLATES["warp_row"].trusted
    assert prepare(tdef, child, "sm_90a", BF16, {}).render_error == ""
    rng = random.Random(0)
    g = child
    for _ in range(500):
        g = mutate_tile(g, tdef, rng, 90, [BF16])
        if g.param("rows_per_warp") == 4:
            break
    assert g.param("rows_per_warp") == 4 and g.text == child.text
    # the same point without the text, as a fresh draw, a template switch or a resumed run makes it
    bare = Genome.make(tdef.op, tdef.name, tdef.source_hash, g.params_dict())
    cta = TEMPLATES["cta_row"]
    switched = switch_template(Genome.make("rmsnorm", "cta_row", cta.source_hash, cta.default_params()),
                               {"cta_row": cta, tdef.name: tdef}, random.Random(1), 90, [BF16])
    assert bare.text is None and switched.template == tdef.name and switched.text is None
    for genome in (g, bare):
        bi = prepare(tdef, genome, "sm_90a", BF16, {})
        assert bi.render_error.startswith("unsafe rendered CUDA") and '"/etc/passwd"' in bi.render_error
        with Builder(workers=1) as b:
            (r,) = b.build([bi])
        assert r.status is Status.RENDER_ERROR and r.error == bi.render_error and r.cubin == b""
    # the file template at the same point is not the LLM's: it renders no include
    same = Genome.make("rmsnorm", "warp_row", TEMPLATES["warp_row"].source_hash, g.params_dict())
    assert prepare(TEMPLATES["warp_row"], same, "sm_90a", BF16, {}).render_error == ""


# Exponential template instantiation: depth 1 compiles in milliseconds, depth 18 keeps NVRTC busy for minutes.
SLOW = HEADER.replace("threads = [128]", "threads = [128]\ndepth = [1, 2, 3, 18]").replace(
    "threads = 128", "threads = 128\ndepth = 1") + """
template <int N, int M> struct T { static constexpr int v = T<N - 1, 2 * M>::v + T<N - 1, 2 * M + 1>::v; };
template <int M> struct T<0, M> { static constexpr int v = M & 1; };
extern "C" __global__ void k(int* x) { x[0] = T<{{ depth }}, 0>::v; }
"""


def _slow_inputs(*depths: int) -> list:
    t = parse_template(SLOW, "slow")
    return [prepare(t, Genome.make("rmsnorm", "evil", t.source_hash, {"threads": 128, "depth": d}), "sm_90a",
                    {"x": "float32"}, {}) for d in depths]


def _new_children(before: set[int]) -> list:
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.pid not in before]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_compile_past_the_timeout_is_killed_and_the_batch_goes_on(workers):
    import multiprocessing as mp
    import signal
    import time

    fast, fast2, fast3, slow = _slow_inputs(1, 2, 3, 18)
    before = {p.pid for p in mp.active_children()}
    with Builder(workers=workers, timeout_s=0.5) as b:
        (r0,) = b.build([fast])
        (first,) = _new_children(before)  # the compile process that will get the slow input
        t0 = time.monotonic()
        r1, r2, r3 = b.build([slow, fast2, fast3])
        elapsed = time.monotonic() - t0
        assert r0.status is Status.OK and r2.status is Status.OK and r3.status is Status.OK, r2.error + r3.error
        assert r2.cubin[:4] == b"\x7fELF" and r2.build_key == fast2.key() and r3.build_key == fast3.key()
        assert r1.status is Status.COMPILE_ERROR and r1.error == "NVRTC compile exceeded 0.5 s"
        assert r1.cubin == b"" and r1.build_key == slow.key() and r1.compile_ms >= 500
        assert not first.is_alive() and first.exitcode == -signal.SIGKILL  # killed and reaped, not abandoned
        assert elapsed < 30  # the slow input was not waited out
        (r4,) = b.build([_slow_inputs(1)[0]])  # cached, and the builder still works
        assert r4 is r0
        live = _new_children(before)
        assert live and all(p.is_alive() for p in live) and first not in live
    assert all(not p.is_alive() for p in live)  # close() leaves no compile process behind


def test_a_compiler_process_that_dies_is_a_compile_error_and_is_replaced():
    import multiprocessing as mp
    import os
    import signal
    import threading

    fast, fast2, slow = _slow_inputs(1, 2, 18)
    before = {p.pid for p in mp.active_children()}
    with Builder(workers=1, timeout_s=60) as b:
        b.build([fast])
        (first,) = _new_children(before)
        killer = threading.Timer(1.0, os.kill, (first.pid, signal.SIGKILL))  # as if NVRTC crashed
        killer.start()
        r1, r2 = b.build([slow, fast2])
        killer.join()
    assert r1.status is Status.COMPILE_ERROR and r1.error == f"the compiler process died (exit code {-signal.SIGKILL})"
    assert r2.status is Status.OK


def test_the_build_key_covers_the_rendered_source():
    """Two renderings of one genome (an include edited between them) are two builds; one rendering is one."""
    from dataclasses import replace

    tdef = TEMPLATES["warp_row"]
    g = Genome.make("rmsnorm", "warp_row", tdef.source_hash, tdef.default_params())
    bi = prepare(tdef, g, "sm_90a", {"x": "bfloat16", "w": "bfloat16"}, {})
    again = prepare(tdef, g, "sm_90a", {"x": "bfloat16", "w": "bfloat16"}, {})
    assert bi.source and again.key() == bi.key()
    edited = replace(bi, source=bi.source + "\n// an include edited since\n")
    assert edited.genome.key() == bi.genome.key() and edited.key() != bi.key()

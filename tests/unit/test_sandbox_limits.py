"""The bounded sandbox: no template body or header expression can hang a run or fill its memory."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from evo.build.nvrtc import Builder, prepare
from evo.core.genome import Genome
from evo.templates.render import render
from evo.templates.sandbox import (
    MAX_OUTPUT,
    RENDER_TIMEOUT_S,
    LimitError,
    eval_expression,
    render_text,
)
from evo.core.status import Status
from evo.templates.template import TemplateError, parse_template
from ops.rmsnorm.spec import cell

BF16 = {"x": "bfloat16", "w": "bfloat16"}
HEADER = """{#- kfactory
[template]
op = "rmsnorm"
name = "bounded"
[space]
threads = [128, 256]
[defaults]
threads = 128
[constraints]
CONSTRAINTS
[[launch]]
kernel = "k"
grid = ["M"]
block = ["threads"]
args = ["x"]
-#}
"""


def _tdef(body: str = "", constraint: str = 'warp_multiple = "threads % 32 == 0"'):
    return parse_template(HEADER.replace("CONSTRAINTS", constraint) + body, "test")


# Each must end at once (or at the render's time limit), as RENDER_ERROR naming the limit.
BODIES = {
    "nested-range-100000": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                            "range() of 100000 items"),
    "nested-range-output": ("{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}",
                            "template output|time limit"),  # whichever comes first on a loaded machine
    "repeat-300M": ('{{ "x" * 300000000 }}', "repeated string"),
    "doubling-concat": ('{% set ns = namespace(s="x") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}'
                        "{% endfor %}{{ ns.s }}", "joined string"),
    "set-block": ('{% set s %}{% for i in range(10000) %}{{ "y" * 1000 }}{% endfor %}{% endset %}{{ s }}',
                  "template output|time limit"),
    "ljust": ('{{ "x".ljust(10**9) }}', "str.ljust()"),
    "center-filter": ('{{ "x"|center(1000000000) }}', "|center"),
    "format-width": ('{{ "{:>999999999}".format(1) }}', "format width"),
    "percent-width": ('{{ "%0999999999d" % 1 }}', "format width"),
    "huge-power": ("{{ 10 ** 100000000 }}", "bits"),
    "join": ('{{ ("x" * 1000000).join(range(10000)|map("string")) }}', "str.join()"),
    "list-doubling": ("{% set l = [1] %}{% for i in range(30) %}{% set _ = l.extend(l) %}{% endfor %}",
                      "a list, dict or set"),
    "busy-loop": ("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
                  "time limit"),
}


@pytest.mark.parametrize("body, says", BODIES.values(), ids=BODIES.keys())
def test_over_a_limit_is_a_render_error_with_a_clear_message(body, says):
    tracemalloc.start()
    t0 = time.monotonic()
    r = render(_tdef(body), {"threads": 128}, 90, BF16, {})
    took = time.monotonic() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.status is Status.RENDER_ERROR and r.source == ""
    assert r.error.startswith("LimitError: ") and any(x in r.error for x in says.split("|")), r.error
    assert took < RENDER_TIMEOUT_S + 1.5
    assert peak < 64 * MAX_OUTPUT  # nothing near the 300 MB / GB the template asked for was allocated


def test_the_runaway_loop_examples_end_quickly():
    for body in (BODIES["nested-range-100000"][0], BODIES["repeat-300M"][0]):
        t0 = time.monotonic()
        assert render(_tdef(body), {"threads": 128}, 90, BF16, {}).status is Status.RENDER_ERROR
        assert time.monotonic() - t0 < 1.0


def test_ordinary_templates_render_unchanged():
    body = ('{% set n = threads // 32 %}{% for i in range(n) %}{{ i }},{% endfor %} {{ "a" ~ "b" }} '
            "{{ [1, 2] + [3] }} {{ 2 ** 10 }} {{ '%4d' % 7 }} {{ 'x' * 3 }}")
    r = render(_tdef(body), {"threads": 128}, 90, BF16, {})
    assert r.status is Status.OK
    assert r.source.endswith("0,1,2,3, ab [1, 2, 3] 1024    7 xxx")


def test_output_limit_holds_exactly():
    assert len(render_text("{{ 'x' * %d }}" % MAX_OUTPUT, {})) == MAX_OUTPUT
    with pytest.raises(LimitError, match="exceeds the sandbox limit"):
        render_text("{{ 'x' * %d }}" % MAX_OUTPUT + "y", {})


def test_time_limit_is_wall_clock():
    t0 = time.monotonic()
    with pytest.raises(LimitError, match="time limit of 0.3 s"):
        render_text("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", {}, seconds=0.3)
    assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize("expr, says", [
    ('"x" * 300000000', "repeated string"),
    ("range(10**6)|list|length", "range()"),
    ("threads ** threads ** threads", "bits"),
], ids=["repeat", "range", "power"])
def test_header_expressions_are_bounded_and_name_the_constraint(expr, says):
    tdef = _tdef(constraint=f"blowup = '{expr} != 0'")
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as e:
        tdef.is_valid({"threads": 128}, 90, BF16)
    assert time.monotonic() - t0 < 1.0
    msg = str(e.value)
    assert "template bounded: constraint blowup" in msg and "LimitError" in msg and says in msg


def test_expression_time_limit():
    with pytest.raises(LimitError, match="time limit"):
        eval_expression("range(10000)|map('string')|map('length')|sum + (range(10000)|list|length)", {}, seconds=0.0)


def test_a_template_over_a_limit_builds_as_render_error_and_nothing_compiles():
    tdef = _tdef(BODIES["nested-range-100000"][0])
    g = Genome.make("rmsnorm", tdef.name, tdef.source_hash, {"threads": 128})
    c = cell("bf16", 4096, 1024)
    bi = prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict())
    with Builder(workers=1) as b:
        (res,) = b.build([bi])
        assert b.compiled == 0
    assert res.status is Status.RENDER_ERROR and "range() of 100000 items" in res.error

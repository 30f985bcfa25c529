"""The launch plan language: `when` (a launch only where an expression holds), `stream = "side"` with
`fork_after` (a launch beside the main stream, after a named main launch), `pdl` (a programmatic dependent launch
where an expression holds), their parse errors, the build's kernel list, and the exported package's table (the same
plan from the exported JSON)."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import prepare
from evo.core.genome import Genome
from evo.export.document import template_doc
from evo.export.runtime.package.table import _template
from evo.templates.template import TemplateError, parse_template

HEAD = '''{{#- kfactory
[template]
op = "toy"
name = "toy"

[space]
overlap = [false, true]
threads = [128, 256]

[defaults]
overlap = false
threads = 128

[workspace]
ws_flag = "4 * N if overlap else 0"
{launches}
-#}}
{body}
'''
LAUNCHES = '''
[[launch]]
kernel = "zero"
when = "overlap"
grid = ["1"]
block = ["32"]
args = ["ws_flag"]

[[launch]]
kernel = "prep"
grid = ["N"]
block = ["threads"]
args = ["x", "ws_flag"]

[[launch]]
kernel = "recur"
when = "overlap"
stream = "side"
fork_after = "zero"
grid = ["N // 4"]
block = ["64"]
args = ["y", "ws_flag"]

[[launch]]
kernel = "recur_in_order"
when = "not overlap"
pdl = "threads == 256"
grid = ["N // 4"]
block = ["64"]
args = ["y"]
'''
BODY = '''extern "C" __global__ void prep(float* x{% if overlap %}, int* f{% endif %}) {}
extern "C" __global__ void recur_in_order(float* y) {}
{% if overlap %}
extern "C" __global__ void zero(int* f) {}
extern "C" __global__ void recur(float* y, int* f) {}
{% endif %}'''


def toy(launches: str = LAUNCHES):
    return parse_template(HEAD.format(launches=launches, body=BODY), "toy.cu.j2", trusted=True)


def test_when_keeps_a_launch_only_where_it_holds():
    t = toy()
    on, ws = t.plan({"overlap": True, "threads": 256}, 90, {}, {"N": 64})
    assert [(ln.kernel, ln.stream, ln.fork_after) for ln in on] == [("zero", "main", ""), ("prep", "main", ""),
                                                                   ("recur", "side", "zero")]
    assert on[1].block == (256, 1, 1) and on[2].grid == (16, 1, 1) and ws == {"ws_flag": 256}
    off, ws = t.plan({"overlap": False, "threads": 128}, 90, {}, {"N": 64})
    assert [(ln.kernel, ln.stream) for ln in off] == [("prep", "main"), ("recur_in_order", "main")]
    assert ws == {"ws_flag": 0}


def test_the_build_requires_only_the_kernels_its_plan_launches():
    t = toy()
    for overlap, kernels in ((True, ("zero", "prep", "recur")), (False, ("prep", "recur_in_order"))):
        g = Genome.make("toy", "toy", t.source_hash, {"overlap": overlap, "threads": 128})
        bi = prepare(t, g, "sm_90a", {}, {"N": 64})
        assert not bi.render_error and bi.kernels == kernels
        assert ("__global__ void zero" in bi.source) == overlap


def test_a_when_the_build_cannot_decide_is_a_render_error():
    t = toy(LAUNCHES.replace('when = "overlap"\ngrid = ["1"]', 'when = "N > 8"\ngrid = ["1"]'))
    g = Genome.make("toy", "toy", t.source_hash, {"overlap": True, "threads": 128})
    bi = prepare(t, g, "sm_90a", {}, {"N": 64})  # N is not specialized: unknown at build time
    assert "cannot be decided at build time" in bi.render_error and "N" in bi.render_error


@pytest.mark.parametrize("launches, message", [
    (LAUNCHES.replace('stream = "side"', 'stream = "other"'), "stream 'other' is not one of"),
    (LAUNCHES.replace('fork_after = "zero"\n', ''), "names the main launch it forks after"),
    (LAUNCHES.replace('kernel = "prep"\n', 'kernel = "prep"\nfork_after = "zero"\n'), "only a side launch does"),
    (LAUNCHES.replace('fork_after = "zero"', 'fork_after = "later"'), "'later' is not a main launch declared before"),
    (LAUNCHES.replace('when = "not overlap"', 'whenever = "not overlap"'), "unknown key(s) ['whenever']"),
])
def test_plan_language_errors_name_the_launch_and_the_key(launches, message):
    with pytest.raises(TemplateError) as e:
        toy(launches)
    assert message in str(e.value) and "toy.cu.j2: [[launch]] #" in str(e.value)


def test_pdl_marks_a_launch_where_its_expression_holds():
    t = toy()
    for threads, pdl in ((256, True), (128, False)):
        launches, _ = t.plan({"overlap": False, "threads": threads}, 90, {}, {"N": 64})
        assert [(ln.kernel, ln.pdl) for ln in launches] == [("prep", False), ("recur_in_order", pdl)]
    launches, _ = t.plan({"overlap": True, "threads": 256}, 90, {}, {"N": 64})
    assert not any(ln.pdl for ln in launches)


def test_pdl_is_for_main_launches_and_never_the_plan_s_first():
    """A side launch cannot be pdl (parse error); a main launch can, but where it is the first launch of the plan
    (nothing of the plan before it to depend on: it would overlap the caller's work) planning refuses it."""
    with pytest.raises(TemplateError, match=r"\[\[launch\]\] #2: pdl .* main-stream launches only"):
        toy(LAUNCHES.replace('stream = "side"\n', 'stream = "side"\npdl = "threads > 0"\n'))
    t = toy(LAUNCHES.replace('kernel = "prep"\n', 'kernel = "prep"\npdl = "threads > 0"\n'))
    launches, _ = t.plan({"overlap": True, "threads": 128}, 90, {}, {"N": 64})  # after zero: fine
    assert [(ln.kernel, ln.pdl) for ln in launches][:2] == [("zero", False), ("prep", True)]
    with pytest.raises(TemplateError, match="prep is a programmatic dependent launch .pdl. and the plan's first launch"):
        t.plan({"overlap": False, "threads": 128}, 90, {}, {"N": 64})


def test_a_side_launch_whose_fork_point_is_not_in_the_plan_is_refused():
    t = toy(LAUNCHES.replace('when = "overlap"\ngrid = ["1"]', 'when = "threads == 256"\ngrid = ["1"]'))
    with pytest.raises(TemplateError, match="forks after 'zero', which no main launch before it in this plan runs"):
        t.plan({"overlap": True, "threads": 128}, 90, {}, {"N": 64})


@pytest.mark.parametrize("params", [{"overlap": True, "threads": 256}, {"overlap": False, "threads": 128},
                                    {"overlap": False, "threads": 256}])
def test_the_exported_table_plans_as_the_factory_does(params):
    t = toy()
    doc = template_doc("toy", t)
    assert not {"when", "stream", "pdl"} & set(doc["launches"][1])  # unset keys stay out
    assert doc["launches"][3]["pdl"] == "threads == 256"
    exported = _template("toy-1", doc, {})
    ours, ws = t.plan(params, 90, {}, {"N": 64})
    theirs, ws2 = exported.plan(params, 90, {}, {"N": 64})
    assert [tuple(vars(x).values()) for x in theirs] == [tuple(vars(x).values()) for x in ours] and ws2 == ws

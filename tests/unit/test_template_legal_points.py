"""TemplateDef.legal_points (backtracking over the space) against the brute force it replaces: every point
of the product that is_valid accepts, in the product's order, on real templates and cells of three ops;
pinned params; bad pins refused by name."""

from __future__ import annotations

from itertools import product

import pytest

from evo.templates.template import TemplateError, load_templates
from evo.core.registry import get_op
from tests.unit.test_sandbox_limits import HEADER as BOUNDED

ARCH = 90


def brute(t, dtypes, dims, fixed=None):
    fixed = fixed or {}
    names = t.param_names
    out = []
    for vals in product(*((fixed[n],) if n in fixed else t.values(n) for n in names)):
        p = dict(zip(names, vals))
        if t.is_valid(p, ARCH, dtypes, dims):
            out.append(p)
    return out


def _cells(op: str, n: int):
    return list(get_op(op).matrix())[:n]


CASES = [("kda", "recurrent", c) for c in _cells("kda", 8) if c.dim("T") == 1][:2]
CASES += [("kda", "recurrent_bulk", c) for c in _cells("kda", 8) if c.dim("T") == 1][:2]
def _served(op: str, name: str, n: int):
    """The first n cells of op's matrix where the template's default point is legal."""
    t = load_templates(op)[name]
    return [c for c in get_op(op).matrix() if t.is_valid(t.default_params(), ARCH, c.dtypes_dict(), c.dims_dict())][:n]


CASES += [("rmsnorm", name, c) for name in ("cta_row", "warp_row", "rows_bulk") for c in _served("rmsnorm", name, 2)]
CASES += [("softmax", name, c) for name in load_templates("softmax") for c in _cells("softmax", 1)]


@pytest.mark.parametrize("op, name, c", CASES, ids=[f"{o}-{n}-{c.label()}" for o, n, c in CASES])
def test_legal_points_are_the_brute_force_set_in_its_order(op, name, c):
    t = load_templates(op)[name]
    want = brute(t, c.dtypes_dict(), c.dims_dict())
    got = t.legal_points(ARCH, c.dtypes_dict(), c.dims_dict())
    assert got == want
    assert want  # every case holds legal points: the comparison is not of two empty lists


def test_without_a_cell_the_dim_constraints_are_skipped_as_is_valid_skips_them():
    t = load_templates("kda")["recurrent"]
    c = _cells("kda", 8)[0]
    assert t.legal_points(ARCH, c.dtypes_dict()) == brute(t, c.dtypes_dict(), None)


def test_pinned_params_keep_their_value_and_match_the_brute_force():
    t = load_templates("kda")["recurrent"]
    c = next(x for x in _cells("kda", 8) if x.dim("T") == 1)
    pin = {"qkg": "smem", "vec": 2}
    got = t.legal_points(ARCH, c.dtypes_dict(), c.dims_dict(), fixed=pin)
    assert got == brute(t, c.dtypes_dict(), c.dims_dict(), pin) and got
    assert all(p["qkg"] == "smem" and p["vec"] == 2 for p in got)


@pytest.mark.parametrize("pin, words", [({"nope": 1}, "unknown params"), ({"vec": 3}, "outside the space")])
def test_bad_pins_are_refused_by_name(pin, words):
    t = load_templates("kda")["recurrent"]
    c = _cells("kda", 8)[0]
    with pytest.raises(TemplateError, match=words):
        t.legal_points(ARCH, c.dtypes_dict(), c.dims_dict(), fixed=pin)


# ---- a header's constraints evaluated together ----------------------------------------------------------------

# the sandbox tests' header with a second param and three constraints, the last raising at vec = 0
TOGETHER = (BOUNDED.replace('name = "bounded"', 'name = "together"')
            .replace("threads = [128, 256]", "threads = [64, 128, 256]\nvec = [1, 2, 4, 0]")
            .replace("threads = 128", "threads = 128\nvec = 1")
            .replace("CONSTRAINTS", 'warp_multiple = "threads % 128 == 0"\nwide = "threads * (vec + 1) >= 256"\n'
                                    'divides = "256 // vec >= 1"'))


def test_constraints_together_give_each_ones_verdict_and_name_the_one_that_raises():
    """violations evaluates a header's constraints in one sandbox call: the same names as one at a time; where one
    raises (vec = 0 divides by zero), the error names it whether or not an earlier one failed; legal_points stops at a
    prefix's first failure, as one at a time did, so a point refused before the raising one does not raise there."""
    from evo.templates.template import parse_template

    t = parse_template(TOGETHER, "together")
    assert t.violations({"threads": 64, "vec": 1}, ARCH, {}) == ["warp_multiple", "wide"]
    assert t.violations({"threads": 128, "vec": 2}, ARCH, {}) == []
    assert t.violations({"threads": 256, "vec": 1}, ARCH, {}) == []
    for threads in (64, 256):  # warp_multiple and wide fail at 64 and hold at 256: divides raises either way
        with pytest.raises(TemplateError, match="constraint divides: .*ZeroDivisionError"):
            t.violations({"threads": threads, "vec": 0}, ARCH, {})
    with pytest.raises(TemplateError, match="constraint divides"):
        t.legal_points(ARCH, {})  # threads 256 with vec 0: warp_multiple and wide hold, divides raises
    assert t.legal_points(ARCH, {}, fixed={"threads": 64}) == []  # warp_multiple refuses every point first
    # at 128, wide refuses vec 0 before divides is read
    assert t.legal_points(ARCH, {}, fixed={"threads": 128}) == [{"threads": 128, "vec": v} for v in (1, 2, 4)]

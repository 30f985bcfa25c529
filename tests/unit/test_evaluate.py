"""make_job binds an op's optional tensors only where the genome's plan uses them: a toy op y = x + bias,
bias optional, in its two variants, checked by the real gate on the numpy device; a plan that leaves out a
tensor its cell's variant uses is INVALID on that cell."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.evaluate import make_job, variant_gap
from evo.measure.evaluators import EvalItem, GpuEvaluator
from evo.measure.gate import Gate
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.templates.template import parse_template
from evo.core.contract import _runnable_problems
from evo.core.spec import Cell, FillSpec, OpSpec, Role, TensorSpec, Tolerance
from tests.unit.fake_device import FakeDevice, FakeRunner

CELL = Cell.make({"x": "fp32"}, {"M": 4, "N": 24})  # x and y 384 bytes, bias 96, a float64 reference 768
TOY = OpSpec(
    name="toy_add",
    tensors=(TensorSpec("x", ("M", "N"), "x"), TensorSpec("bias", ("N",), "x", optional=True),
             TensorSpec("y", ("M", "N"), "x", role=Role.OUT)),
    scalars=(),
    dtype_roles=("x",),
    reference=lambda t, s: {"y": t["x"] + t.get("bias", 0.0)},
    make_inputs=lambda cell, kind, rng: {"x": rng.standard_normal((cell.dim("M"), cell.dim("N")))},
    input_kinds=("normal", "shifted"),
    tolerance=lambda cell, out: Tolerance(1e-6, 1e-6, 1e-6),
    bytes_moved=lambda cell: 8 * cell.dim("M") * cell.dim("N"),
    matrix=lambda: [CELL],
    edge_cells=lambda: [CELL],
    fills={"normal": {"x": FillSpec(), "bias": FillSpec(mean=2.0, std=0.5)},
           "shifted": {"x": FillSpec(mean=3.0), "bias": FillSpec(mean=-1.0)}},
    baselines=("toy.eager",),
)


def template(name: str, args: str) -> str:
    return (f'{{#- kfactory\n[template]\nop = "toy_add"\nname = "{name}"\ndescription = "y = x (+ bias)"\n'
            'specialize = []\n[space]\nthreads = [128]\n[defaults]\nthreads = 128\n'
            f'[[launch]]\nkernel = "{name}"\ngrid = ["M"]\nblock = ["threads"]\nsmem = "0"\nargs = {args}\n-#}}\n'
            f'extern "C" __global__ void {name}() {{}}\n')


PLAIN = parse_template(template("plain", '["x", "y", "M", "N"]'))
BIASED = parse_template(template("biased", '["x", "bias", "y", "M", "N"]'))


# The same op whose cells say whether they use the bias (a dim, 0 where absent): a template serves both
# variants by naming it "bias?".
CELL_B = Cell.make({"x": "fp32"}, {"M": 4, "N": 24, "bias": 1})
TOY_V = OpSpec(**{**TOY.__dict__, "dim_defaults": {"bias": 0}, "tensors": (
    TOY.tensors[0], replace(TOY.tensors[1], used_when=lambda c: TOY_V.dim_value(c, "bias") == 1), TOY.tensors[2])})
COND = parse_template(template("cond", '["x", "bias?", "y", "M", "N"]'))


def job(tdef, op=TOY, cell=CELL):
    g = Genome.make("toy_add", tdef.name, tdef.source_hash, tdef.default_params())
    return g, make_job(op, tdef, g, BuildResult("k", Status.OK), cell, 90, seed=1, timing=None, baseline=False)


def rows(dev: FakeDevice, args: tuple) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """x, bias (None for a null pointer) and the output of a bound launch: x, [bias,] out, M, N."""
    *ptrs, (_, m), (_, n) = args
    x, out = dev.view(ptrs[0][1], "float32", m * n).reshape(m, n), ptrs[-1][1]
    bias = dev.view(ptrs[1][1], "float32", n) if len(ptrs) == 3 and ptrs[1][1] else None
    return x, bias, out


def gate(tdef, kernel, op=TOY, cell=CELL):
    """The gate over the numpy device; returns the Outcome, what was allocated, and the bias the reference saw."""
    seen: list[bool] = []

    def reference(dev, args):
        x, bias, out = rows(dev, args)
        seen.append(bias is not None)
        y = x.astype(np.float64) + (bias.astype(np.float64) if bias is not None else 0.0)
        dev.view(out, "float64", y.size)[:] = y.reshape(-1)

    def candidate(dev, args):
        x, bias, out = rows(dev, args)
        dev.view(out, "float32", x.size)[:] = kernel(x, bias).reshape(-1)

    dev = FakeDevice({tdef.name: candidate, "toy_ref": reference})
    sizes: list[int] = []
    alloc = dev.alloc
    dev.alloc = lambda nbytes, guard=None: sizes.append(nbytes) or alloc(nbytes, guard)
    ref_mod = SimpleNamespace(
        reference=lambda dims, dtypes, scalars: [("toy_ref", (dims["M"], 1, 1), (128, 1, 1),
                                                  (("buf", "x"), ("buf", "bias"), ("buf", "ref:y"),
                                                   ("i32", dims["M"]), ("i32", dims["N"])))],
        tail_width=lambda dims: 1)
    g, j = job(tdef, op, cell)
    res = Gate(dev, j, "cand", "toyref", ref_mod, random.Random(0), (("gpu", "fake"),), dev.ceiling_gbps).run()
    return judge(res, {"y": 1e-6}, g, cell), sizes, seen


def test_a_variant_that_leaves_the_optional_tensor_out_gets_no_buffer_fill_or_reference_input():
    _, j = job(PLAIN)
    assert [b.name for b in j.buffers] == ["x", "y"] and j.left_out == ("bias",)
    assert all(dict(specs).keys() == {"x"} for _, specs in j.fills)
    outcome, sizes, seen = gate(PLAIN, lambda x, bias: x)
    assert outcome.status is Status.OK, outcome.error
    assert 96 not in sizes and 384 in sizes  # never allocated (nor its private copy)
    assert seen and not any(seen)  # the reference got a null pointer for it


def test_a_variant_that_uses_the_optional_tensor_gets_it_allocated_filled_and_checked():
    _, j = job(BIASED)
    assert [b.name for b in j.buffers] == ["x", "bias", "y"] and j.left_out == ()
    assert {k: dict(specs)["bias"].mean for k, specs in j.fills} == {"normal": 2.0, "shifted": -1.0}
    outcome, sizes, seen = gate(BIASED, lambda x, bias: x + bias)
    assert outcome.status is Status.OK, outcome.error
    assert 96 in sizes and seen and all(seen)
    ignored, _, _ = gate(BIASED, lambda x, bias: x)  # a kernel that drops the bias is caught
    assert ignored.status is Status.WRONG_ANSWER


@pytest.mark.parametrize("fills, ok", [({"x": FillSpec()}, True), ({"x": FillSpec(), "bias": FillSpec()}, True),
                                       ({"bias": FillSpec()}, False)], ids=["required", "with-optional", "missing-x"])
def test_an_input_kind_may_fill_an_optional_tensor_and_must_fill_the_required(fills, ok):
    spec = OpSpec(**{**TOY.__dict__, "fills": {"normal": fills}})
    assert (not any("input kind" in p for p in _runnable_problems(spec))) is ok


def test_a_conditional_arg_binds_the_optional_tensor_only_on_the_cells_the_op_says_use_it():
    """"bias?": a null pointer, no buffer, fill or reference input on a cell without the bias (its dim
    absent: the op's default 0); allocated, filled and checked on a cell with it."""
    _, j = job(COND, TOY_V, CELL)
    assert [b.name for b in j.buffers] == ["x", "y"] and j.left_out == ("bias",)
    assert j.launches[0].args[1] == ("ptr", 0) and all(dict(specs).keys() == {"x"} for _, specs in j.fills)
    outcome, sizes, seen = gate(COND, lambda x, bias: x, TOY_V, CELL)
    assert outcome.status is Status.OK, outcome.error
    assert 96 not in sizes and seen and not any(seen)
    _, j = job(COND, TOY_V, CELL_B)
    assert [b.name for b in j.buffers] == ["x", "bias", "y"] and j.left_out == ()
    assert j.launches[0].args[1] == ("buf", "bias")
    outcome, sizes, seen = gate(COND, lambda x, bias: x + bias, TOY_V, CELL_B)
    assert outcome.status is Status.OK, outcome.error
    assert 96 in sizes and seen and all(seen)
    ignored, _, _ = gate(COND, lambda x, bias: x, TOY_V, CELL_B)  # a kernel that drops the bias is caught
    assert ignored.status is Status.WRONG_ANSWER


def test_a_conditional_arg_needs_a_tensor_whose_use_the_op_decides():
    with pytest.raises(ValueError, match="no used_when"):  # TOY's bias does not say which cells use it
        job(COND, TOY, CELL)
    with pytest.raises(KeyError, match="conditional"):
        job(parse_template(template("cond_dim", '["x", "bias?", "y", "M?", "N"]')), TOY_V, CELL)
    _, j = job(parse_template(template("cond_x", '["x?", "bias?", "y", "M", "N"]')), TOY_V, CELL)
    assert j.launches[0].args[0] == ("buf", "x")  # a required tensor is used by every cell


def test_a_dim_a_cell_lacks_takes_the_ops_default():
    assert TOY_V.dim_value(CELL, "bias") == 0 and TOY_V.dim_value(CELL_B, "bias") == 1
    assert TOY_V.dim_value({"M": 4}, "M") == 4
    with pytest.raises(KeyError, match="no default"):
        TOY.dim_value(CELL, "bias")


def test_a_plan_that_leaves_out_a_tensor_its_cells_variant_uses_is_invalid_there_and_never_run():
    """PLAIN leaves the bias out: right for the plain variant's cell, INVALID on a cell whose variant adds the
    bias (where it would compute x alone, right by the plain op's reference and ranked as the biased op)."""
    assert variant_gap(TOY_V, PLAIN, job(PLAIN, TOY_V, CELL)[0], CELL, 90) == ""
    g = job(PLAIN, TOY_V, CELL)[0]
    why = variant_gap(TOY_V, PLAIN, g, CELL_B, 90)
    assert "leaves out bias" in why
    with pytest.raises(ValueError, match="leaves out bias"):
        job(PLAIN, TOY_V, CELL_B)
    runner = FakeRunner({})
    ev = GpuEvaluator(TOY_V, 90, runner, Timing(), seed=1, baseline=False)
    out, = ev.evaluate([EvalItem(g, PLAIN, CELL_B, BuildResult("k", Status.OK))])
    assert out.status is Status.INVALID and out.error == why and not runner.jobs


def test_every_kda_cell_requires_its_states():
    """KDA's cells count the recurrent states in their bytes: a decode plan without them is INVALID."""
    from evo.templates.template import load_templates
    from ops.kda import SPEC as KDA
    from ops.kda.spec import decode_matrix

    rec = load_templates("kda")["recurrent"]
    stateless = parse_template(rec.text.replace('"initial_state", "o", "final_state"', '"o"'))
    c = decode_matrix()[1]
    g = Genome.make("kda", rec.name, stateless.source_hash, rec.default_params())
    assert variant_gap(KDA, rec, g, c, 90) == ""
    assert "leaves out initial_state, final_state" in variant_gap(KDA, stateless, g, c, 90)

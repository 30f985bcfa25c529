"""make_job binds an op's optional tensors only where the genome's plan uses them: a toy op y = x + bias,
bias optional, in its two variants, checked by the real gate on the numpy device."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.evaluate import make_job
from evo.measure.gate import Gate
from evo.measure.verify import judge
from evo.templates.template import parse_template
from ops.contract import _runnable_problems
from ops.spec import Cell, FillSpec, OpSpec, Role, TensorSpec, Tolerance
from tests.unit.fake_device import FakeDevice

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


def job(tdef):
    g = Genome.make("toy_add", tdef.name, tdef.source_hash, tdef.default_params())
    return g, make_job(TOY, tdef, g, BuildResult("k", Status.OK), CELL, 90, seed=1, timing=None, baseline=False)


def rows(dev: FakeDevice, args: tuple) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """x, bias (None for a null pointer) and the output of a bound launch: x, [bias,] out, M, N."""
    *ptrs, (_, m), (_, n) = args
    x, out = dev.view(ptrs[0][1], "float32", m * n).reshape(m, n), ptrs[-1][1]
    bias = dev.view(ptrs[1][1], "float32", n) if len(ptrs) == 3 and ptrs[1][1] else None
    return x, bias, out


def gate(tdef, kernel):
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
    dev.alloc = lambda nbytes: sizes.append(nbytes) or alloc(nbytes)
    ref_mod = SimpleNamespace(
        reference=lambda dims, dtypes, scalars: [("toy_ref", (dims["M"], 1, 1), (128, 1, 1),
                                                  (("buf", "x"), ("buf", "bias"), ("buf", "ref:y"),
                                                   ("i32", dims["M"]), ("i32", dims["N"])))],
        tail_width=lambda dims: 1)
    g, j = job(tdef)
    res = Gate(dev, j, "cand", "toyref", ref_mod, random.Random(0), (("gpu", "fake"),), dev.ceiling_gbps).run()
    return judge(res, {"y": 1e-6}, g, CELL), sizes, seen


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

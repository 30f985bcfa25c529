"""KDA on a decode cell, on the numpy device: the fp32 final state is held to fp32's tolerance (not the
activations' bf16), and a decode loop of a drawn length chains the state call to call, so an error below one
call's tolerance that adds up over a decode loop is caught; the emulated recurrent template passes both."""

from __future__ import annotations

import random

import pytest

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.evaluate import make_job
from evo.measure.gate import Gate
from evo.measure.verify import judge
from ops.kda import SPEC
from ops.kda import device as kda_device
from ops.kda.spec import STATE_TOLERANCES, cell, decode_loop, prefill_matrix
from evo.core.spec import DType, quantize
from tests.unit.test_kda_recurrent import ARCH, TDEF, KdaFakeDevice, emulated_kernel

BF, FP32 = DType.BF16, DType.FP32
CELL = cell(BF, 4, 1, 2, 32, 32)  # decode: one token, fp32 state
PARAMS = TDEF.default_params() | {"v_tile": 16, "vec": 2, "k_lanes": 4}
G = Genome.make("kda", "recurrent", TDEF.source_hash, PARAMS)
BUILD = BuildResult("k", Status.OK)
HONEST = emulated_kernel(CELL, PARAMS)


def with_state(edit):
    """The emulated template, then `edit` applied to the final state it wrote (fp32 [N, HV, K, V])."""
    def run(dev, args):
        HONEST(dev, args)
        ptr, n = args[7][1], dev.state["grid"][2]
        shape = (n, args[10][1], CELL.dim("K"), CELL.dim("V"))
        dev.write(ptr, FP32, edit(dev.read(ptr, FP32, shape)))
    return run


# The state kept through bf16 (in an fp32 buffer): 2^-9 relative, inside bf16's bound, far outside fp32's.
BF16_STATE = with_state(lambda s: quantize(s, BF))
# A decay biased by 1e-5 a call (a fast exp's error): 1e-5 relative, inside fp32's one-call bound.
DRIFT = with_state(lambda s: s * (1 + 1e-5))


def run(kernel, secret: int = 0):
    job = make_job(SPEC, TDEF, G, BUILD, CELL, ARCH, seed=3, timing=None, baseline=False, secret=secret)
    res = Gate(KdaFakeDevice({"kda_recurrent": kernel}), job, "cand", "ref", kda_device, random.Random(0)).run()
    return job, res, judge(res, {k: t[2] for k, t in job.tolerances}, G, CELL)


def test_a_decode_cells_fp32_state_takes_fp32s_tolerance_and_prefill_keeps_the_coarser():
    assert SPEC.tolerance(CELL, "final_state") == STATE_TOLERANCES[FP32]
    assert SPEC.tolerance(prefill_matrix()[0], "final_state") == STATE_TOLERANCES[BF]


def test_a_state_kept_through_bf16_is_wrong_on_a_decode_cell():
    _, res, out = run(BF16_STATE)
    assert out.status is Status.WRONG_ANSWER and out.error.startswith("final_state"), out.error
    worst = max(c.rel_norm_err for _, cs in res.checks for c in cs if c.output == "final_state")
    assert STATE_TOLERANCES[FP32].rel_norm < worst < STATE_TOLERANCES[BF].rel_norm  # bf16's bound let it pass


@pytest.mark.parametrize("kernel, secret, want", [
    (HONEST, 0x51, Status.OK),
    (DRIFT, 0, Status.OK),  # no decode loop: every single call is inside the bound
    (DRIFT, 0x51, Status.WRONG_ANSWER),
], ids=["honest-loop", "drift-one-call", "drift-loop"])
def test_a_decode_loop_catches_an_error_that_adds_up_over_calls(kernel, secret, want):
    job, res, out = run(kernel, secret)
    assert bool(job.loop) is bool(secret)
    assert out.status is want, out.error
    if secret:
        lp, = job.loop
        assert 48 <= lp.steps <= 80 and lp.kind == "decay_near_one"
        assert any(w.startswith("decode loop") for w, _ in res.checks) or want is not Status.OK
    if want is Status.WRONG_ANSWER:
        assert "decode loop of" in out.error


def test_no_decode_loop_where_the_state_is_bf16_or_the_cell_is_no_decode_step():
    assert decode_loop(CELL, 64) is not None
    assert decode_loop(cell(BF, 4, 1, 2, 32, 32, state=BF), 64) is None
    assert decode_loop(cell(BF, 2, 3, 1, 16, 16), 64) is None

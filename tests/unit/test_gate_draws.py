"""What a gate job draws from its secret, on the numpy device: check cells' shapes at residues of the template's
tile and scalars from the op's ranges, guard zones per buffer, the secret itself from the OS and recorded with a
failure so it replays. Kernels right only where an earlier gate's constants put them are caught; honest ones pass."""

from __future__ import annotations

import re

import numpy as np
import pytest

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.draws import implied_tile, shape_rng
from evo.measure.evaluate import make_job
from evo.measure.evaluators import EvalItem, GpuEvaluator, gate_cells_for
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.templates.template import load_templates
from ops.rmsnorm.spec import SPEC, cell
from tests.unit.fake_device import FakeDevice, FakeRunner, cost_us, honest_rms, honest_rows, run_gate, unpack

WARP = load_templates("rmsnorm")["warp_row"]  # M at runtime, rows_per_warp x threads / 32 = 4 rows a CTA
G = Genome.make("rmsnorm", "warp_row", WARP.source_hash, WARP.default_params())
CELL = cell("fp16", 64, 256)
BUILD = BuildResult("k", Status.OK)
REL = {"y": SPEC.tolerance(CELL, "y").rel_norm}
FIXED_M = (1, 37, 1059)  # the gate cells' M before they were drawn
SECRET = 0x5EC2E7


def job(secret: int = 0):
    """The job for warp_row on CELL: gate cells drawn from `secret`, or (0) the op's fixed ones at eps's default."""
    rng = shape_rng(secret) if secret else None
    gates = gate_cells_for(SPEC, WARP, G, CELL, 90, rng)
    return make_job(SPEC, WARP, G, BUILD, CELL, 90, seed=1, timing=None, baseline=False, gate_cells=gates,
                    secret=secret)


def fixed_tail(dev, args):
    """Drops the rows of a partial last CTA except at the M the fixed gate cells (and the cell) use."""
    x, w, y, m, n, eps = unpack(dev, args)
    keep = m if m in (*FIXED_M, CELL.dim("M")) else m - m % 4
    y[:keep] = honest_rows(x[:keep], w, eps).astype(y.dtype)
    cost_us(dev, m, n)


def folded_eps(dev, args):
    """eps folded to its default, whatever the call passes."""
    x, w, y, m, n, _ = unpack(dev, args)
    y[:] = honest_rows(x, w, 1e-6).astype(y.dtype)
    cost_us(dev, m, n)


def canary_aware(dev, args):
    """Right only where the bytes before x hold the constant canary (0xA5) an earlier gate wrote there."""
    x, w, y, m, n, eps = unpack(dev, args)
    if np.all(dev.view(args[0][1] - 64, "uint8", 64) == 0xA5):
        y[:] = honest_rows(x, w, eps).astype(y.dtype)
    cost_us(dev, m, n, 0.5)


def status(kernel, j) -> tuple[Status, str]:
    o = judge(run_gate(FakeDevice({"rmsnorm_warp_row": kernel}), j), REL, G, CELL)
    return o.status, o.error


def test_drawn_shapes_cover_the_tiles_residues_and_no_power_of_two():
    assert implied_tile(WARP, G.params_dict(), 90, CELL, "M") == 4
    residues, labels = set(), set()
    for secret in range(1, 13):
        ms = [c.dim("M") for c in gate_cells_for(SPEC, WARP, G, CELL, 90, shape_rng(secret)) if c.dim("N") == 256]
        assert 1 in ms and any(m % 4 == 3 and m > 4 for m in ms)  # a last CTA one row short of full
        assert not [m for m in ms if m > 2 and m & (m - 1) == 0]
        residues |= {m % 4 for m in ms}
        labels.add(tuple(ms))
    assert residues == {0, 1, 2, 3} and len(labels) > 6
    runtime_n = [c for c in gate_cells_for(SPEC, WARP, G, CELL, 90, shape_rng(SECRET)) if c.dim("N") != 256]
    assert any(c.dim("N") % 8 == 0 and (c.dim("N") // 8) % 2 == 1 for c in runtime_n)  # N at runtime: drawn too


@pytest.mark.parametrize("kernel, fixed, drawn", [
    (honest_rms, Status.OK, Status.OK),
    (fixed_tail, Status.OK, Status.WRONG_ANSWER),
    (folded_eps, Status.OK, Status.WRONG_ANSWER),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_kernel_right_only_on_fixed_shapes_and_scalars_fails_drawn_ones(kernel, fixed, drawn):
    assert status(kernel, job())[0] is fixed
    got, error = status(kernel, job(SECRET))
    assert got is drawn, error
    if drawn is not Status.OK:
        assert "gate cell" in error


def test_drawn_scalars_come_from_the_ops_range_and_label_their_cell():
    gates = job(SECRET).gate
    eps = [dict(gc.scalars)["eps"] for gc in gates]
    assert all(1e-7 <= e <= 1e-3 for e in eps) and len(set(eps)) == len(eps) == len(gates)
    assert all(float(re.search(r"eps=(\S+)", gc.label).group(1)) == pytest.approx(e, rel=1e-3)
               for gc, e in zip(gates, eps))


def test_guard_zones_are_drawn_per_buffer_and_per_job():
    guards: dict[int, list] = {}
    for secret in (SECRET, SECRET + 2):
        dev = FakeDevice({"rmsnorm_warp_row": honest_rms})
        alloc = dev.alloc
        dev.alloc = lambda nbytes, guard=None, s=secret: guards.setdefault(s, []).append(guard) or alloc(nbytes, guard)
        assert judge(run_gate(dev, job(secret)), REL, G, CELL).status is Status.OK
    a, b = guards[SECRET], guards[SECRET + 2]
    assert len({g.seed for g in a}) == len(a)  # every buffer its own pattern
    assert len({g.before for g in a}) > 1 and len({g.after for g in a}) > 1  # and its own data offset and sizes
    assert [(g.before, g.after) for g in a] != [(g.before, g.after) for g in b]
    assert status(canary_aware, job(SECRET))[0] is Status.WRONG_ANSWER


def test_each_evaluation_draws_its_secret_and_a_failure_records_what_replays_it():
    runner = FakeRunner({"rmsnorm_warp_row": fixed_tail})
    ev = GpuEvaluator(SPEC, 90, runner, Timing(min_samples=5, max_samples=5, warmup=1), seed=1, baseline=False)
    item = EvalItem(G, WARP, CELL, BUILD)
    first, second = ev.evaluate([item]) + ev.evaluate([item])
    secrets = {j.secret for j in runner.jobs}
    assert len(secrets) == 2 and 0 not in secrets  # the same config seed, a new secret each time
    assert first.status is Status.WRONG_ANSWER
    note = re.search(r"\nreplay: (secret (0x[0-9a-f]+); checked on: .*)", first.error)
    assert note and note.group(1) == first.replay
    secret = int(note.group(2), 16)
    again = job(secret)
    assert [gc.label for gc in again.gate] == [gc.label for gc in runner.jobs[0].gate]
    assert all(gc.label in first.replay for gc in again.gate)
    replayed = status(fixed_tail, again)
    assert replayed[0] is Status.WRONG_ANSWER and replayed[1] == first.error.split("\nreplay:")[0]


def test_every_kda_job_checks_a_grouping_of_several_qk_heads_of_several_value_heads_each():
    """Whatever the secret, one drawn KDA check cell has H >= 2 and HV / H >= 2 (a kernel mapping value head hv to
    qk head hv % H, not hv / (HV / H), agrees with the right map wherever H = 1 or HV = H), and a long one a
    one-token-chunk template's state carries through (48 to 80 tokens)."""
    from ops.kda.spec import SPEC as KDA, cell as kda_cell, token_shapes

    for c in (kda_cell("bf16", 16, 1, 32), kda_cell("bf16", 1, 8192, 32), kda_cell("bf16", 1, 8192, 32, n=8)):
        for secret in range(1, 41):
            cells = token_shapes(c, shape_rng(secret), lambda dim: 1)
            assert any(x.dim("H") >= 2 and x.dim("HV") // x.dim("H") >= 2 for x in cells), (c.label(), secret)
            assert any(48 <= x.dim("T") <= 80 for x in cells), (c.label(), secret)
    assert KDA.gate_shapes is token_shapes

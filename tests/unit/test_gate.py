"""The gate's rules on the CPU: the real evo.measure.gate.Gate over a numpy device against fake cheating kernels.

Each fake kernel is one class of cheat from the adversarial gallery, written in Python; the gate and
verify.judge must give it the status the gallery expects, and an honest kernel must pass.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import numpy as np
import pytest

from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.gate import HOLD_US, Gate, failed
from evo.measure.jobs import GateCell, LaunchJob, Timing
from evo.measure.verify import judge
from ops.rmsnorm import device as rms_device
from ops.rmsnorm.spec import SPEC, cell
from tests.unit.fake_device import (
    FakeDevice,
    FakePeer,
    FakeTensor,
    as_dtype,
    cost_us,
    honest_rms,
    honest_rms_peer,
    honest_rows,
    rms_job,
    run_gate,
    unpack,
)
from tests.unit.rms_shortcuts import SHORTCUTS

CELL = cell("fp16", 37, 256)
G = Genome.make("rmsnorm", "fake", "", {})
REL = {"y": SPEC.tolerance(CELL, "y").rel_norm}


honest = honest_rms


def skip(dev, args):
    _, _, _, m, n, _ = unpack(dev, args)
    cost_us(dev, m, n, 0.01)


def status_of(kernel, job=None, seed=0, **dev_kw):
    dev = FakeDevice({"cand": kernel}, **dev_kw)
    res = run_gate(dev, job or rms_job(CELL), seed)
    return judge(res, REL, G, CELL), res, dev


def test_honest_kernel_passes_every_round():
    v, res, dev = status_of(honest)
    assert v.status is Status.OK, v.error
    wheres = [w for w, _ in res.checks]
    for kind in SPEC.gate_kinds():
        assert f"kind {kind}" in wheres
    assert any(w.startswith("stress") for w in wheres)
    assert any(w.startswith("warm-up") for w in wheres)
    assert any(w.startswith("last timed launch") for w in wheres)
    assert any(w.startswith("perturbed") for w in wheres)
    # some timed samples were checked after the fact (graph timing here: a whole replay at a time)
    assert any(w.startswith("timed graph replay") for w in wheres)
    assert any(w.endswith("before perturbing") for w in wheres)
    assert len(res.times_us) == len(res.baseline_us) == 20
    # read-backs are batched: one audit and one collect per checked launch, fewer for batches
    assert dev.readbacks <= 2 * len(res.checks) + len(SPEC.gate_kinds()) + 8


# ---- inputs ---------------------------------------------------------------------------------------

def zero_weight(dev, args):
    x, w, y, m, n, eps = unpack(dev, args)
    w[:] = 0
    y[:] = 0
    cost_us(dev, m, n, 0.5)


def in_place(dev, args):
    x, w, y, m, n, eps = unpack(dev, args)
    y[:] = honest_rows(x, w, eps).astype(y.dtype)
    x[:] = y
    cost_us(dev, m, n)


def corrupt_private_copy(dev, args):
    """Zero every other buffer holding a copy of the weight (the reference's private copy), write zeros."""
    x, w, y, m, n, eps = unpack(dev, args)
    for b in list(dev.bufs.values()):
        d = dev.data(b)
        if b.ptr != args[1][1] and d.nbytes == w.nbytes and np.array_equal(d, w.view(np.uint8)):
            d[:] = 0
    y[:] = 0
    cost_us(dev, m, n, 0.5)


@pytest.mark.parametrize("kernel", [zero_weight, in_place, corrupt_private_copy], ids=lambda k: k.__name__)
def test_a_kernel_that_writes_inputs_is_input_modified(kernel):
    v, res, _ = status_of(kernel)
    assert v.status is Status.INPUT_MODIFIED, v
    assert res.input_faults and not res.times_us


def test_reference_reads_the_private_copy():
    """Zero the weight but write the honest answer of the original weight: right output, still caught."""
    def sneaky(dev, args):
        x, w, y, m, n, eps = unpack(dev, args)
        y[:] = honest_rows(x, w, eps).astype(y.dtype)
        w[:] = 0
    v, res, _ = status_of(sneaky)
    assert v.status is Status.INPUT_MODIFIED
    assert "input w changed" in res.input_faults[0]


# ---- telling checked launches from timed ones ------------------------------------------------------

def nan_detect(dev, args):
    x, w, y, m, n, eps = unpack(dev, args)
    if np.isnan(y[0, 0]):  # the old gate poisoned with NaN only before checked launches
        honest(dev, args)
    else:
        cost_us(dev, m, n, 0.01)


def launch_count(dev, args):
    dev.state["n"] = dev.state.get("n", 0) + 1
    (honest if dev.state["n"] <= 12 else skip)(dev, args)


def skip_seen_pointer(dev, args):
    """Assume the output still holds the answer for an input pointer seen before."""
    seen = dev.state.setdefault("seen", set())
    key = (args[0][1], args[2][1])
    (skip if key in seen else honest)(dev, args)
    seen.add(key)


def probe_skip(dev, args):
    """Fast on the launches right after the checks, where the old gate probed for graph mode."""
    dev.state["n"] = dev.state.get("n", 0) + 1
    (skip if 11 <= dev.state["n"] <= 16 else honest)(dev, args)


def half_the_time(dev, args):
    """After the checks, skip on every other launch."""
    dev.state["n"] = dev.state.get("n", 0) + 1
    (skip if dev.state["n"] > 30 and dev.state["n"] % 2 else honest)(dev, args)


@pytest.mark.parametrize("kernel", [nan_detect, launch_count, skip_seen_pointer, probe_skip, half_the_time],
                         ids=lambda k: k.__name__)
@pytest.mark.parametrize("ceiling", [4000.0, 0.1], ids=["graph", "direct"])
def test_a_kernel_that_skips_work_on_launches_it_thinks_are_timed_is_wrong(kernel, ceiling):
    v, res, _ = status_of(kernel, ceiling_gbps=ceiling)
    assert v.status is Status.WRONG_ANSWER, v


def back_to_back(dev, args):
    """Skip when launched right after itself (a graph replay): no flush or poison in between."""
    last = dev.state.get("last_end")
    if last is not None and dev.clock == last:
        skip(dev, args)
    else:
        honest(dev, args)
    dev.state["last_end"] = dev.clock


def test_a_kernel_that_detects_graph_replay_is_wrong():
    v, res, _ = status_of(back_to_back)
    assert v.status is Status.WRONG_ANSWER, v
    # caught where two launches first follow each other with nothing in between: the pair on two streams
    assert any(w in v.error for w in ("graph replay", "last timed launch", "second stream")), v.error


def batch_every_set(dev, args):
    """Its first launch after a poison of its output computes every set it has seen in a launch's latency (2 us: a
    latency-bound cell leaves the GPU mostly idle); a launch whose output is still its answer returns."""
    x, w, y, m, n, eps = unpack(dev, args)
    sets = dev.state.setdefault("sets", {})
    sets[args[2][1]] = args
    done = dev.state.setdefault("done", {})
    if args[2][1] in done and np.array_equal(y.view(np.uint8), done[args[2][1]]):
        cost_us(dev, m, n, 0.01)
        return
    for a in sets.values():
        xs, ws, ys, *_ = unpack(dev, a)
        ys[:] = honest_rows(xs, ws, eps).astype(ys.dtype)
        done[a[2][1]] = ys.view(np.uint8).copy()
    dev.clock += 2.0


def test_a_graph_replay_whose_first_launch_does_every_sets_work_is_suspect():
    """Every output is right whenever it is checked, and its time a launch stays under the copy ceiling's rate;
    the replay's launches are not independent, and its time a launch falls far under its launches outside one."""
    v, res, _ = status_of(batch_every_set)
    assert res.graph and res.direct_us and not res.input_faults
    assert v.status is Status.SUSPECT and "not independent" in v.error, v
    ok, honest_res, _ = status_of(honest)
    assert ok.status is Status.OK and honest_res.direct_us
    assert np.median(honest_res.times_us) == pytest.approx(np.median(honest_res.direct_us), rel=0.05)


def batch_by_time(dev, args):
    """A launch within 1 us of the one before it ends (a replay's launches run back to back) returns when its set is
    one it has seen, at 0.8 of a launch's time (its own set's work done by the replay's first); any other
    launch does its own set and every set it has seen, at one launch's time (it cannot know a burst follows)."""
    x, w, y, m, n, eps = unpack(dev, args)
    sets = dev.state.setdefault("sets", {})
    end = dev.state.get("end")
    if end is not None and dev.clock - end < 1.0 and args[2][1] in sets:
        cost_us(dev, m, n, 0.8)
    else:
        sets[args[2][1]] = args
        for a in sets.values():
            xs, ws, ys, *_ = unpack(dev, a)
            ys[:] = honest_rows(xs, ws, eps).astype(ys.dtype)
        cost_us(dev, m, n)
    dev.state["end"] = dev.clock


class Gate9(Gate):
    """The gate without version 10's replay: its graph launches only checked after the replay, and their time."""

    def _refreshed_replay(self, g, sets):
        return None


def test_a_replay_whose_launches_lean_on_the_first_leaves_the_sets_refreshed_before_their_launch_poisoned():
    """A replay's launches at 0.8 of a launch's time each (above verify.GRAPH_FLOOR of its launches outside one):
    gate 9 ranked it OK, 1.25x faster than it is. Gate 10's replay that poisons each set right before its launch
    (device work, no host round trip between them, as in the timed replay) finds the launches that left their set
    to the first."""
    dev = FakeDevice({"cand": batch_by_time})
    old = judge(run_gate(dev, rms_job(CELL), 0, Gate9), REL, G, CELL)
    assert old.status is Status.OK, old
    v, res, _ = status_of(batch_by_time)
    assert v.status is Status.WRONG_ANSWER and "refreshed before its launch" in v.error, v
    ok, _, _ = status_of(honest)
    assert ok.status is Status.OK


def forge_reference(dev, args):
    """Right on its first two launches with the same inputs; after that it skips the work, writes zeros and writes
    zeros into every float64 buffer of the output's size: the gate's reference, found by scanning memory."""
    x, w, y, m, n, eps = unpack(dev, args)
    seen = dev.state.setdefault("seen", {})
    key = hash(x.tobytes())
    seen[key] = seen.get(key, 0) + 1
    if seen[key] <= 2:
        honest(dev, args)
        return
    skip(dev, args)
    y[:] = 0
    for b in list(dev.bufs.values()):
        if b.nbytes == m * n * 8:
            dev.data(b).view(np.float64)[:] = 0.0


@pytest.mark.parametrize("ceiling", [4000.0, 0.1], ids=["graph", "direct"])
def test_a_kernel_that_overwrites_the_reference_is_caught_at_its_first_forged_check(ceiling):
    """A reused reference is audited (gate 6): every comparison takes its keyed checksum, which must match the one
    taken right after it was computed. Without the audit (gate 4), this kernel passed every check in direct timing
    (its time then flagged only by the copy ceiling) and stress launches 2-4 in graph timing."""
    v, res, _ = status_of(forge_reference, ceiling_gbps=ceiling)
    assert v.status is Status.INPUT_MODIFIED, v
    assert "stress 2/4" in v.error and "reference of y changed" in v.error, v.error


class _Unaudited(Gate):
    """The gate with its reference audit dropped (comparisons enqueued without a checksum key)."""

    def _check(self, g, todo):
        keep = self.key
        self.key = 0
        try:
            return super()._check(g, todo)
        finally:
            self.key = keep


def test_the_forger_test_fails_on_a_gate_without_the_audit():
    """Mutation check of the test above: with the audit's checksums zeroed, the forger's forged checks pass."""
    dev = FakeDevice({"cand": forge_reference}, ceiling_gbps=4000.0)
    res = _Unaudited(dev, rms_job(CELL), "cand", "ref", rms_device, random.Random(0), (("gpu", "fake"),),
                     dev.ceiling_gbps).run()
    v = judge(res, REL, G, CELL)
    assert "stress 2/4" not in v.error, v


def test_an_honest_kernel_reuses_each_reference_and_records_no_fault():
    """Gate 6 computes a set's reference once per content: stress launches 2-4 of a set reuse the reference of
    launch 1 (audited), so there are fewer computations than checks; no fault."""
    counts = {"refs": 0}

    class Counting(Gate):
        def _reference(self, g, s, fresh=False):
            if fresh or g.ref_of != (id(s), s.version):
                counts["refs"] += 1
            return super()._reference(g, s, fresh)

    dev = FakeDevice({"cand": honest})
    res = Counting(dev, rms_job(CELL), "cand", "ref", rms_device, random.Random(0), (("gpu", "fake"),),
                   dev.ceiling_gbps).run()
    assert judge(res, REL, G, CELL).status is Status.OK and not res.input_faults
    assert 0 < counts["refs"] < len(res.checks), (counts, len(res.checks))  # gate 5: one or more per check


# ---- caches -----------------------------------------------------------------------------------------

def pointer_cache(dev, args):
    """rstd per row cached by input pointer: skips the reduction on a pointer it has seen."""
    x, w, y, m, n, eps = unpack(dev, args)
    cache = dev.state.setdefault("r", {})
    if args[0][1] not in cache:
        xf = x.astype(np.float32)
        cache[args[0][1]] = 1.0 / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + np.float32(eps))
    y[:] = (x.astype(np.float32) * cache[args[0][1]] * w.astype(np.float32)).astype(y.dtype)
    cost_us(dev, m, n, 0.9)


def sampled_key_cache(dev, args):
    """Cached by pointer plus two sampled elements: survives refills only if those elements stay."""
    x, w, y, m, n, eps = unpack(dev, args)
    cache = dev.state.setdefault("r", {})
    key = (args[0][1], float(x[0, 0]), float(x[-1, -1]))
    if key not in cache:
        xf = x.astype(np.float32)
        cache[key] = 1.0 / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + np.float32(eps))
    y[:] = (x.astype(np.float32) * cache[key] * w.astype(np.float32)).astype(y.dtype)
    cost_us(dev, m, n, 0.9)


def unzeroed_workspace(dev, args):
    """Accumulates the mean square into a workspace it assumes is zero."""
    x, w, y, m, n, eps = unpack(dev, args)
    ws = dev.view(args[6][1], "float32", m)
    xf = x.astype(np.float32)
    ws += np.mean(xf * xf, axis=1)
    with np.errstate(invalid="ignore"):
            y[:] = (xf / np.sqrt(ws[:, None] + np.float32(eps)) * w.astype(np.float32)).astype(y.dtype)
    cost_us(dev, m, n)


@pytest.mark.parametrize("kernel", [pointer_cache, sampled_key_cache], ids=lambda k: k.__name__)
def test_caches_keyed_by_pointer_go_stale(kernel):
    v, res, _ = status_of(kernel)
    assert v.status is Status.WRONG_ANSWER, v
    if kernel is sampled_key_cache:  # fresh values refill every element it samples: only round C catches it
        assert "perturbed" in v.error, v.error


def test_unzeroed_workspace_is_wrong():
    v, _, _ = status_of(unzeroed_workspace, rms_job(CELL, ws_bytes=4 * CELL.dim("M")))
    assert v.status is Status.WRONG_ANSWER


# ---- formula shortcuts --------------------------------------------------------------------------------

def _variant(fn):
    def k(dev, args):
        x, w, y, m, n, eps = unpack(dev, args)
        y[:] = fn(x.astype(np.float32), w.astype(np.float32), np.float32(eps)).astype(y.dtype)
        cost_us(dev, m, n)
    k.__name__ = fn.__name__
    return k


@pytest.mark.parametrize("fn", SHORTCUTS, ids=lambda f: f.__name__)
def test_formula_shortcuts_are_wrong(fn):
    with np.errstate(all="ignore"):
        v, _, _ = status_of(_variant(fn))
    assert v.status is Status.WRONG_ANSWER, v


def test_a_race_is_caught_by_repeated_launches():
    rng = np.random.default_rng(3)

    def flaky(dev, args):
        honest(dev, args)
        if rng.random() < 0.25:  # a missing barrier: now and then one row reads a stale partial sum
            y = unpack(dev, args)[2]
            y[5] *= 1.5
    v, _, _ = status_of(flaky, rms_job(CELL, timing=None, stress=16))
    assert v.status is Status.WRONG_ANSWER


# ---- beside other work: a second stream, a crowded GPU -------------------------------------------------------

def shared_scratch(dev, args):
    """Its rows' mean squares through a module-global scratch (a "__device__" array every call shares), read back
    after a grid-wide step: right alone, wrong when another call writes the scratch in between."""
    x, w, y, m, n, eps = unpack(dev, args)
    xf = x.astype(np.float32)
    dev.state["scratch"] = np.mean(xf * xf, axis=1, keepdims=True, dtype=np.float32)
    yield  # the grid-wide step between the partial sums and their use
    y[:] = (xf / np.sqrt(dev.state["scratch"] + np.float32(eps)) * w.astype(np.float32)).astype(y.dtype)
    cost_us(dev, m, n)


def grid_barrier(dev, args):
    """A grid-wide spin barrier without a cooperative launch: one CTA a row, each waiting for every other."""
    _, _, _, m, _, _ = unpack(dev, args)
    dev.grid_sync((m, 1, 1))
    honest(dev, args)


def test_state_that_concurrent_calls_share_is_caught_beside_a_second_stream():
    v, res, dev = status_of(shared_scratch)
    assert v.status is Status.WRONG_ANSWER and dev.concurrent_pairs == 1, v
    bad = [w for w, cs in res.checks if any(failed(c, REL["y"]) for c in cs)]
    assert bad == ["set 0 beside set 1's launch on a second stream"], bad  # it read set 1's scratch
    wheres = [w for w, _ in status_of(honest)[1].checks]
    assert "set 1 on a second stream beside set 0's" in wheres and "set 0 beside a kernel holding most SMs" in wheres


def test_a_plan_that_needs_every_cta_resident_is_invalid():
    """37 CTAs wait for each other: beside a kernel holding all but 16 slots they never all run; a grid within the
    free slots passes (M = 9 here, its gate cells smaller still)."""
    v, _, _ = status_of(grid_barrier)
    assert v.status is Status.INVALID and "cooperative launch" in v.error, v
    small = cell("fp16", 9, 256)
    job = rms_job(small)
    dev = FakeDevice({"cand": grid_barrier})
    assert judge(run_gate(dev, job), REL, G, small).status is Status.OK


# ---- gate cells, timing mode, the ceiling --------------------------------------------------------------

def test_gate_cells_run_with_the_same_cubin():
    def wrong_at_m1(dev, args):
        honest(dev, args)
        if args[3][1] == 1:
            unpack(dev, args)[2][:] = 0
    g = cell("fp16", 1, 256)
    args = (("buf", "x"), ("buf", "w"), ("buf", "y"), ("i32", 1), ("i32", 256), ("f32", 1e-6))
    from evo.measure.jobs import BufferDecl
    bufs = tuple(BufferDecl(t.name, t.resolve_dtype(g).value, t.shape(g), t.role.value) for t in SPEC.tensors)
    gc = GateCell(g.label(), tuple(sorted(g.dims_dict().items())), (LaunchJob("cand", (1, 1, 1), (256, 1, 1), 0, args),),
                  bufs, (("eps", 1e-6),))
    v, res, _ = status_of(wrong_at_m1, rms_job(CELL, gate=(gc,)))
    assert v.status is Status.WRONG_ANSWER and "gate cell" in v.error and "M1-" in v.error, v.error
    v_ok, res_ok, dev = status_of(honest, rms_job(CELL, gate=(gc,)))
    assert v_ok.status is Status.OK and any("gate cell" in w for w, _ in res_ok.checks)
    # the gate cell's small grid runs a pair on two streams too (where both grids are resident together)
    assert dev.concurrent_pairs == 2 and f"set 1 on a second stream beside set 0's on {g.label()}" in \
        [w for w, _ in res_ok.checks]


@pytest.mark.parametrize("ceiling, graph", [(4000.0, True), (0.1, False)], ids=["short-cell", "long-cell"])
def test_mode_comes_from_the_cell_never_a_kernel(ceiling, graph):
    """37 x 256 fp16 moves 38 kB: 0.01 us at 4000 GB/s (graph), 384 us at 0.1 GB/s (direct), whatever
    the candidate or the baseline take."""
    for base_us in (1.0, 500.0):
        for fraction in (0.01, 100.0):
            def k(dev, args, fraction=fraction):
                x, w, y, m, n, eps = unpack(dev, args)
                y[:] = honest_rows(x, w, eps).astype(y.dtype)
                cost_us(dev, m, n, fraction)
            _, res, dev = status_of(k, baseline_us=base_us, ceiling_gbps=ceiling)
            assert res.graph is graph
            assert len(res.baseline_us) == len(res.times_us) == 20


def test_direct_timing_checks_random_samples():
    _, res, _ = status_of(honest, ceiling_gbps=0.1)
    assert not res.graph and any(w.startswith("timed sample") for w, _ in res.checks)


def test_without_a_baseline_the_candidate_is_still_timed():
    v, res, _ = status_of(honest, baseline_us=None)
    assert v.status is Status.OK and res.baseline_us == () and len(res.times_us) == 20


@pytest.mark.parametrize("ceiling", [4000.0, 0.1], ids=["graph", "direct"])
def test_every_sample_flushes_for_both_candidate_and_baseline(ceiling):
    _, res, dev = status_of(honest, ceiling_gbps=ceiling)
    assert dev.resets == len(res.times_us) + len(res.baseline_us) + len(res.direct_us)
    assert dev.baseline_calls == len(res.baseline_us) * (dev.state.get("graph_launches", 1) if res.graph else 1)


def test_faster_than_the_copy_ceiling_is_suspect():
    def fast(dev, args):
        x, w, y, m, n, eps = unpack(dev, args)
        y[:] = honest_rows(x, w, eps).astype(y.dtype)
        cost_us(dev, m, n, 0.5)  # 6000 GB/s against a 4000 GB/s ceiling
    v, _, _ = status_of(fast)
    assert v.status is Status.SUSPECT and "copy ceiling" in v.error
    assert v.median_us == float("inf")  # never ranked
    v_ok, _, _ = status_of(honest)  # 3000 GB/s: fine
    assert v_ok.status is Status.OK and v_ok.median_us < float("inf")


def test_graph_mode_uses_one_set_per_launch_and_checks_them_all():
    _, res, dev = status_of(honest, rms_job(CELL, timing=Timing(min_samples=20, max_samples=20, warmup=3,
                                                                   graph_launches=24)))
    assert res.graph and dev.state["graph_launches"] >= 24  # at least graph_launches sets, one launch each
    last = {w for w, _ in res.checks if w.startswith("last timed launch")}
    assert len(last) == dev.state["graph_launches"]


# ---- named peers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("graph_below_us", [5.0, 0.0], ids=["graph", "direct"])
def test_every_named_peer_is_timed_beside_the_candidate_and_absent_ones_are_named(graph_below_us):
    timing = Timing(min_samples=20, max_samples=20, warmup=3, graph_below_us=graph_below_us)
    job = rms_job(CELL, timing=timing, baselines=("fake.baseline", "peer.fast", "peer.missing", "peer.unknown"))
    v, res, dev = status_of(honest, job,
                            peers={"peer.fast": 2.0, "peer.missing": "not installed: No module named 'peer'"})
    assert v.status is Status.OK and res.graph is (graph_below_us > 0)
    assert [n for n, _ in res.peers] == ["fake.baseline", "peer.fast"]
    assert all(len(t) == len(res.times_us) for _, t in res.peers)  # same samples, same loop, same mode
    assert dict(v.peers)["peer.fast"] < dict(v.peers)["fake.baseline"]
    assert dict(res.absent) == {"peer.missing": "not installed: No module named 'peer'",
                                "peer.unknown": "no baseline named 'peer.unknown'"}
    assert v.baseline == "fake.baseline" and v.baseline_us == dict(v.peers)["fake.baseline"]
    per = dev.state.get("graph_launches", 1) if res.graph else 1
    assert dev.peer_calls["peer.fast"] == dev.peer_calls["fake.baseline"] == len(res.times_us) * per
    # the candidate and both peers: one flush per sample each; and one per launch of the candidate outside the graph
    assert dev.resets == len(res.times_us) * 3 + len(res.direct_us)
    # launch by launch, each timed call (ours and the peers') waits behind a hold of the stream, so a
    # peer's host-side dispatch is not timed; a graph replay needs none (the candidate's launches outside it do)
    assert dev.holds == ([HOLD_US] * len(res.direct_us) if res.graph else [HOLD_US] * (len(res.times_us) * 3))


def test_without_peers_direct_timing_holds_nothing():
    _, res, dev = status_of(honest, rms_job(CELL, timing=Timing(min_samples=20, max_samples=20, warmup=3,
                                                                   graph_below_us=0.0), baseline=False))
    assert not res.graph and dev.holds == [] and not res.peers


def test_without_torch_every_peer_is_absent_and_the_candidate_still_timed():
    v, res, _ = status_of(honest, rms_job(CELL, baselines=("torch.rms_norm", "liger")), baseline_us=None)
    assert v.status is Status.OK and res.peers == () and len(res.times_us) == 20
    assert dict(res.absent) == {"torch.rms_norm": "torch with CUDA is not importable",
                                "liger": "torch with CUDA is not importable"}


# ---- peers' outputs checked against the reference before they are timed ---------------------------------

def _peer(edit):
    """A fake peer returning the honest y for the set, edited."""
    return FakePeer(2.0, lambda dev, job, ins: edit(honest_rms_peer(dev, job, ins)))


PEERS_JOB = rms_job(CELL, baselines=("fake.baseline", "peer.under_test"))


def test_a_correct_peer_is_checked_stays_present_and_the_check_is_recorded():
    v, res, _ = status_of(honest, PEERS_JOB, peers={"peer.under_test": _peer(lambda y: y)})
    assert v.status is Status.OK and [n for n, _ in res.peers] == ["fake.baseline", "peer.under_test"]
    assert res.absent == ()
    checked = dict(v.peers_checked)
    assert set(checked) == {"fake.baseline", "peer.under_test"}
    assert checked["peer.under_test"].startswith("ok at 2 x tolerance: y rel norm err")


@pytest.mark.parametrize("edit, match", [
    (lambda y: y * np.float16(1.01), r"wrong: y \d+ of 9472 elements outside atol 0.004 \+ rtol 0.004"),
    (lambda y: y[:-1], "wrong: y has 9216 elements, the cell's has 9472"),  # a row missing
    (lambda y: np.concatenate([y[:-1], np.zeros_like(y[-1:])]), r"wrong: y \d+ of 9472 elements outside"),
    (lambda y: np.where(np.arange(y.size).reshape(y.shape) == 5, np.float16(np.nan), y), "wrong: y 1 of 9472 elements non-finite"),
    (lambda y: FakeTensor(as_dtype(y.astype(np.float32), "bfloat16").bits, "bfloat16"),
     "wrong: y comes as bfloat16, coarser than the cell's float16"),
    (lambda y: y.astype(np.int32), "wrong: y comes as int32, not a float dtype"),
], ids=["scaled-1.01", "row-missing", "row-zero", "one-nan", "coarser-dtype", "int-dtype"])
def test_a_wrong_peer_is_absent_with_the_reason_and_never_timed(edit, match):
    v, res, dev = status_of(honest, PEERS_JOB, peers={"peer.under_test": _peer(edit)})
    assert v.status is Status.OK  # the candidate is judged as before
    assert [n for n, _ in res.peers] == ["fake.baseline"] and "peer.under_test" not in dev.peer_calls
    assert re.fullmatch(match + ".*", dict(res.absent)["peer.under_test"]), dict(res.absent)
    assert "peer.under_test" not in dict(res.peers_checked)


def test_a_peer_with_another_eps_is_caught():
    """A differently defined peer (eps 1e-2 instead of the cell's 1e-6) fails on the rel norm or elementwise."""
    peer = FakePeer(2.0, lambda dev, job, ins: honest_rms_peer(dev, job, ins, eps=1e-2))
    _, res, _ = status_of(honest, PEERS_JOB, peers={"peer.under_test": peer})
    assert dict(res.absent)["peer.under_test"].startswith("wrong: y ")


def test_the_first_peer_wrong_makes_the_next_one_the_baseline():
    v, res, _ = status_of(honest, rms_job(CELL, baselines=("peer.under_test", "fake.baseline")),
                          peers={"peer.under_test": _peer(lambda y: y * np.float16(1.01))})
    assert v.baseline == "fake.baseline" and res.baseline_name == "fake.baseline"


@pytest.mark.parametrize("result, match", [
    (lambda y: (y, y, y), "rmsnorm peer 'peer.under_test' returned a 3-tuple; expected y or"),
    (lambda y: (y, y), r"peer_outputs\('peer.under_test'\) maps its result to \['residual_out', 'y'\]; the cell's "
                       r"outputs are \['y'\] \(\['residual_out'\] are not outputs of the op\)"),
], ids=["3-tuple", "output-the-cell-lacks"])
def test_a_peer_result_the_op_hook_cannot_map_is_a_clear_error(result, match):
    with pytest.raises(ValueError, match=match):
        status_of(honest, PEERS_JOB, peers={"peer.under_test": _peer(result)})


def test_an_op_without_a_peer_outputs_hook_is_a_clear_error():
    from evo.measure.gate import Gate

    hooks = SimpleNamespace(reference=rms_device.reference, tail_width=rms_device.tail_width)
    dev = FakeDevice({"cand": honest})
    with pytest.raises(NotImplementedError, match=r"ops/rmsnorm/device.py\) have no peer_outputs\(name, result\)"):
        Gate(dev, PEERS_JOB, "cand", "ref", hooks, random.Random(0)).run()


def test_the_gate_cost_scripts_gate_8_side_is_the_gate_without_its_newest_rounds():
    """experiments/scripts/gate_cost.py times the gate against Gate8: the same checks and timing, none of versions 9's
    and 10's (no pair on two streams, no crowded launch, no causal check, no refreshed replay), so its ratio is what
    those rounds cost."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "scripts" / "gate_cost.py"
    spec = importlib.util.spec_from_file_location("gate_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = {}
    for cls in (Gate, mod.Gate8):
        dev = FakeDevice({"cand": honest})
        res = cls(dev, rms_job(CELL), "cand", "ref", rms_device, random.Random(0), (("gpu", "fake"),),
                  dev.ceiling_gbps).run()
        assert judge(res, REL, G, CELL).status is Status.OK
        runs[cls.__name__] = ([w for w, _ in res.checks], dev.concurrent_pairs)
    nine, eight = runs["Gate"], runs["Gate8"]
    assert nine[1] == 1 and eight[1] == 0

    def new(ws: list[str]) -> list[str]:
        return [w for w in ws if "second stream" in w or "most SMs" in w or "refreshed before its launch" in w]

    def rounds(ws: list[str]) -> set[str]:  # the checks no random draw names (which samples are checked is drawn)
        return {w.split(" (")[0] for w in ws if not w.startswith(("timed", "last timed"))}

    refreshed = [w for w in new(nine[0]) if "refreshed" in w]
    assert len(new(nine[0])) - len(refreshed) == 3 and len(refreshed) >= 20 and new(eight[0]) == []
    assert rounds(nine[0]) - {w.split(" (")[0] for w in new(nine[0])} == rounds(eight[0])

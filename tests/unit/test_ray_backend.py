"""The Ray backend on a local Ray instance (127.0.0.1): real NVRTC builds as Ray tasks, fake GPU actors."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'kernel-factory[ray]'")

from evo.build import cache as build_cache  # noqa: E402
from evo.build.nvrtc import Builder, BuildInput, BuildResult, prepare  # noqa: E402
from evo.core.genome import Genome  # noqa: E402
from evo.measure.jobs import EvalJob, JobResult  # noqa: E402
from evo.measure.ray_backend import RayBuilder, RayRunner, init_ray  # noqa: E402
from evo.measure.run import CRASH, TIMEOUT, WorkerBugError, WorkerStartError  # noqa: E402
from evo.search.space import sample  # noqa: E402
from evo.core.status import Status  # noqa: E402
from evo.templates.template import load_templates  # noqa: E402
from tests.unit import fake_worker  # noqa: E402

TIMEOUT_S = 2.0  # per job inside an actor; a hang costs this much
DT = {"x": "bfloat16", "w": "bfloat16"}
DIMS = {"M": 4096, "N": 4096}


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    """A local Ray instance whose tasks, like the local builder's compile processes, run NVRTC themselves: the run's
    build cache ($KF_BUILD_CACHE) is off in this module, so a Ray task's build is compared with a local compile."""
    cache = os.environ.pop(build_cache.ENV, None)
    init_ray("", num_cpus=2, num_gpus=0)
    yield
    ray.shutdown()
    if cache is not None:
        os.environ[build_cache.ENV] = cache


@pytest.fixture(scope="module")
def inputs() -> list[BuildInput]:
    """Six distinct legal RMSNorm genomes over every template of the plain op, plus a broken source and a
    render error."""
    tdefs = {k: t for k, t in load_templates("rmsnorm").items() if k != "cta_row_fused"}  # the residual variant's
    rng = random.Random(1)
    out: list[BuildInput] = []
    seen: set[str] = set()
    names = sorted(tdefs)
    while len(out) < 6:
        t = tdefs[names[len(out) % len(names)]]
        p = sample(t, rng, 90, [DT], [DIMS])
        g = Genome.make("rmsnorm", t.name, t.source_hash, p or {})
        if p and g.key() not in seen and t.is_valid(p, 90, DT, DIMS):
            seen.add(g.key())
            out.append(prepare(t, g, "sm_90a", DT, DIMS))
    good = out[0]
    broken = replace(good, genome=replace(good.genome, source_hash="broken"), source=good.source + "\n#error boom\n")
    unrendered = replace(good, genome=replace(good.genome, source_hash="unrendered"), source="",
                         render_error="bad jinja")
    return out + [broken, unrendered]


def job(job_id: str) -> EvalJob:
    return EvalJob(job_id, "fake", (), (), b"", (), (), (), ("normal",) * 3, (), 0)


def pid(r: JobResult) -> str:
    return dict(r.fingerprint)["pid"]


def runner(**kw) -> RayRunner:
    args = dict(num_actors=2, timeout_s=TIMEOUT_S, worker_target=fake_worker.serve, num_gpus_per_actor=0)
    return RayRunner(**(args | kw))


def alive(p: str) -> bool:
    stat = Path(f"/proc/{p}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---- build ---------------------------------------------------------------------------------------

def test_build_matches_local_builder(inputs: list[BuildInput]) -> None:
    with Builder(workers=1) as local:
        want = local.build(inputs)
    with RayBuilder() as rb:
        got = rb.build(inputs)
        again = rb.build(list(reversed(inputs)))
    assert [r.build_key for r in got] == [bi.key() for bi in inputs] == [r.build_key for r in want]
    assert [r.status for r in got] == [Status.OK] * 6 + [Status.COMPILE_ERROR, Status.RENDER_ERROR]
    assert "boom" in got[6].log and got[6].error == want[6].error and got[7].error == "bad jinja"
    for g, w in zip(got[:6], want[:6]):
        assert g.regs > 0 and g.cubin[:4] == b"\x7fELF"
        assert g.cubin == w.cubin and g.resources == w.resources and g.compiler == w.compiler
    assert all(a is b for a, b in zip(again, reversed(got)))  # the second batch came from the cache


def test_build_dedups_and_uses_given_cache(inputs: list[BuildInput]) -> None:
    fake = {inputs[0].key(): BuildResult(inputs[0].key(), Status.COMPILE_ERROR, error="recorded earlier")}
    with RayBuilder(cached=fake) as rb:
        out = rb.build([inputs[0], inputs[1], inputs[1]])
    assert out[0] is fake[inputs[0].key()]  # never recompiled
    assert out[1] is out[2] and out[1].status is Status.OK


def test_a_compile_past_the_timeout_is_a_compile_error_and_the_batch_goes_on() -> None:
    from tests.unit.test_render_build import _slow_inputs

    slow, quick = _slow_inputs(18, 1)
    with RayBuilder(timeout_s=3.0) as rb:
        out = rb.build([slow, quick])
    assert out[0].status is Status.COMPILE_ERROR and "exceeded 3 s" in out[0].error
    assert out[1].status is Status.OK and out[1].cubin[:4] == b"\x7fELF"


# ---- run -----------------------------------------------------------------------------------------

def test_batch_with_hang_and_die() -> None:
    ids = ["ok1", "hang1", "ok2", "die1", "ok3", "ok4", "ok5", "ok6"]
    seen: list[str] = []
    hang_s = 6.0  # the other actor restarts its dead worker and drains the queue within it, on a loaded machine too
    with runner(timeout_s=hang_s) as r:
        assert r.fingerprint["device"] == "0" and r.ceiling_gbps == fake_worker.CEILING_GBPS
        actors = r.actor_ids()
        t0 = time.monotonic()
        out = r.run([job(i) for i in ids], on_result=lambda x: seen.append(x.job_id))
        wall = time.monotonic() - t0
        assert r.actor_ids() == actors and r.replaced == 0  # the watchdogs inside the actors coped
        assert sorted(r.worker_restarts()) == [1, 1]  # one actor's worker hung, the other's died
        after = r.run([job("ok7"), job("ok8")])
    assert [x.job_id for x in out] == ids and sorted(seen) == sorted(ids)
    assert [x.error_kind for x in out] == ["", TIMEOUT, "", CRASH, "", "", "", ""]
    assert f"no answer within {hang_s:.1f} s" in out[1].error and out[3].error.startswith("worker died")
    assert seen.index("hang1") == len(ids) - 1  # the other actor drained the queue meanwhile
    # the watchdog cut the hang (it sleeps an hour): room for a loaded 2-core machine, where + 3 s once failed
    assert wall < hang_s + 30.0
    assert all(x.error_kind == "" for x in after)
    assert len({pid(x) for x in out if not x.error_kind}) >= 2


def test_dead_actor_is_crash_and_replaced() -> None:
    with runner(timeout_s=60.0) as r:
        first = r.actor_ids()
        doomed = r._actors[0]  # slot 0 takes the first job: the hang, which holds it until killed
        threading.Timer(1.5, ray.kill, args=(doomed,)).start()
        out = r.run([job("hang1")] + [job(f"ok{i}") for i in range(4)])
        now = r.actor_ids()
        assert r.replaced == 1 and now[0] != first[0] and now[1] == first[1]
        assert r.run([job("ok9")] * 3)[0].error_kind == ""
    assert out[0].error_kind == CRASH and out[0].error.startswith("GPU actor died: ")
    assert all(x.error_kind == "" for x in out[1:])


def test_stuck_actor_misses_deadline() -> None:
    with runner(timeout_s=60.0, deadline_s=3.0) as r:
        warm = r.run([job("ok1"), job("ok2")])  # one job per slot: slot 0's worker served ok1
        worker = pid(warm[0])
        out = r.run([job("hang1"), job("ok3")])  # slot 0 gets the hang; its watchdog would wait 60 s
        assert r.replaced == 1
        assert r.run([job("ok4")])[0].error_kind == ""
    assert out[0].error_kind == TIMEOUT and "actor killed and replaced" in out[0].error
    assert out[1].error_kind == ""
    deadline = time.monotonic() + 10.0
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(worker)  # the hung worker did not outlive its actor


def test_harness_bug_raises() -> None:
    with runner() as r:
        with pytest.raises(WorkerBugError, match="job bug1"):
            r.run([job("bug1")])
        assert r.run([job("ok1")])[0].error_kind == ""


def test_actor_that_cannot_start() -> None:
    with pytest.raises(WorkerStartError, match="could not start"):
        with runner(worker_target=fake_worker.dead, num_actors=1):
            pass


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees where it is not installed
    with pytest.raises(ImportError, match=r"pip install -e '\.\[ray\]'"):
        init_ray("")

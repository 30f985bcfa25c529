"""WorkerHandle / GpuRunner against fake worker processes: hangs, deaths, faults and bugs, no GPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fake_worker
from evo.measure.jobs import EvalJob, JobResult
from evo.measure.run import CRASH, TIMEOUT, GpuRunner, WorkerBugError, WorkerHandle, WorkerStartError

TIMEOUT_S = 2.0  # per job; a hang costs this much


def job(job_id: str) -> EvalJob:
    return EvalJob(job_id, "fake", (), (), b"", (), (), (), ("normal",) * 3, (), 0)


def pid(r: JobResult) -> str:
    return dict(r.fingerprint)["pid"]


def worker_pid(h: WorkerHandle) -> str:
    return h.fingerprint["pid"]


@pytest.fixture
def handle() -> Iterator[WorkerHandle]:
    h = WorkerHandle("3", start_timeout=30.0, target=fake_worker.serve)
    yield h
    h.close()


def test_healthy(handle: WorkerHandle) -> None:
    handle.start()
    assert handle.fingerprint["device"] == "3" and handle.ceiling_gbps == fake_worker.CEILING_GBPS
    results = [handle.submit(job(f"ok{i}"), TIMEOUT_S) for i in range(3)]
    assert [r.job_id for r in results] == ["ok0", "ok1", "ok2"]
    assert all(r.error_kind == "" and r.times_us == (1.0, 2.0, 3.0) for r in results)
    assert {pid(r) for r in results} == {worker_pid(handle)}  # one process served them all
    assert handle.restarts == 0


def test_submit_starts_lazily(handle: WorkerHandle) -> None:
    r = handle.submit(job("ok"), TIMEOUT_S)
    assert r.error_kind == "" and pid(r) == worker_pid(handle)


def test_close_stops_worker(handle: WorkerHandle) -> None:
    handle.start()
    proc = handle._p.proc
    handle.close()
    assert not proc.is_alive() and proc.exitcode == 0  # left through the None message, not killed
    assert handle._p is None


def test_hang_is_timeout_and_restart(handle: WorkerHandle) -> None:
    handle.start()
    old, old_proc = worker_pid(handle), handle._p.proc
    r = handle.submit(job("hang1"), TIMEOUT_S)
    assert r.job_id == "hang1" and r.error_kind == TIMEOUT
    assert "no answer within 2.0 s" in r.error
    assert not old_proc.is_alive()  # the hung worker was killed, not left behind
    assert handle.restarts == 1 and worker_pid(handle) != old
    nxt = handle.submit(job("ok"), TIMEOUT_S)
    assert nxt.error_kind == "" and pid(nxt) == worker_pid(handle)


def test_death_is_crash_and_restart(handle: WorkerHandle) -> None:
    handle.start()
    old = worker_pid(handle)
    r = handle.submit(job("die1"), TIMEOUT_S)
    assert r.job_id == "die1" and r.error_kind == CRASH
    assert r.error.startswith("worker died (exit code ")  # the code itself races the reaping: see report
    assert handle.restarts == 1 and worker_pid(handle) != old
    nxt = handle.submit(job("ok"), TIMEOUT_S)
    assert nxt.error_kind == "" and pid(nxt) == worker_pid(handle)


def test_reported_fault_is_crash_and_restart(handle: WorkerHandle) -> None:
    handle.start()
    old = worker_pid(handle)
    r = handle.submit(job("crash1"), TIMEOUT_S)
    assert r.job_id == "crash1" and r.error_kind == CRASH and r.error == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert pid(r) == old  # the worker's own record is passed through
    assert handle.restarts == 1 and worker_pid(handle) != old
    nxt = handle.submit(job("ok"), TIMEOUT_S)
    assert nxt.error_kind == "" and pid(nxt) == worker_pid(handle)


def test_worker_gone_between_jobs(handle: WorkerHandle) -> None:
    handle.start()
    handle._p.proc.kill()
    handle._p.proc.join(timeout=10)
    r = handle.submit(job("ok1"), TIMEOUT_S)
    assert r.error_kind == CRASH and handle.restarts == 1
    assert handle.submit(job("ok2"), TIMEOUT_S).error_kind == ""


def test_bug_raises(handle: WorkerHandle) -> None:
    handle.start()
    with pytest.raises(WorkerBugError, match="job bug1") as e:
        handle.submit(job("bug1"), TIMEOUT_S)
    assert fake_worker.TRACEBACK in str(e.value)
    # the handle restarted the worker and still serves jobs
    assert handle.restarts == 1
    assert handle.submit(job("ok"), TIMEOUT_S).error_kind == ""


def test_dead_at_start_names_reason() -> None:
    h = WorkerHandle("5", start_timeout=30.0, target=fake_worker.dead)
    with pytest.raises(WorkerStartError, match="device 5 could not start: no driver"):
        h.start()
    assert h._p is None


def test_exit_at_start() -> None:
    h = WorkerHandle("0", start_timeout=30.0, target=fake_worker.exits_at_start)
    with pytest.raises(WorkerStartError, match="died while starting"):
        h.start()


def test_silent_at_start() -> None:
    h = WorkerHandle("0", start_timeout=1.0, target=fake_worker.silent_at_start)
    with pytest.raises(WorkerStartError, match="did not start within 1 s"):
        h.start()


def test_restart_counter(handle: WorkerHandle) -> None:
    kinds = [handle.submit(job(i), TIMEOUT_S).error_kind for i in ("die1", "ok1", "crash1", "die2", "ok2")]
    assert kinds == [CRASH, "", CRASH, CRASH, ""]
    assert handle.restarts == 3


def test_runner_batch() -> None:
    ids = ["ok1", "hang1", "ok2", "die1", "ok3"]
    seen: list[str] = []
    with GpuRunner(("0",), timeout_s=TIMEOUT_S, target=fake_worker.serve) as runner:
        assert runner.ceiling_gbps == fake_worker.CEILING_GBPS and runner.fingerprint["device"] == "0"
        out = runner.run([job(i) for i in ids], on_result=lambda r: seen.append(r.job_id))
        h = runner.handles[0]
        assert h.restarts == 2
        proc = h._p.proc
    assert [r.job_id for r in out] == ids and seen == ids
    assert [r.error_kind for r in out] == ["", TIMEOUT, "", CRASH, ""]
    # each restart brought up a fresh process for the jobs after it
    assert len({pid(out[0]), pid(out[2]), pid(out[4])}) == 3
    assert not proc.is_alive()  # __exit__ closed the last worker


def test_worker_may_start_processes() -> None:
    """Peers start processes inside the worker (QuACK's autotuner compiles in a process pool): a
    daemonic worker fails there with 'daemonic processes are not allowed to have children'."""
    h = WorkerHandle("0", start_timeout=60.0, target=fake_worker.with_pool)
    try:
        h.start()
        assert h.fingerprint["pool"] == "49"
        assert h.submit(job("ok"), TIMEOUT_S).error_kind == ""
    finally:
        h.close()


def test_exit_without_close_ends_workers() -> None:
    """Workers are not daemonic (see above), yet a program that never closes its runner still exits:
    the run module's exit hook kills them before multiprocessing's own hook would wait on them."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import fake_worker\n"
            "from evo.measure.run import WorkerHandle\n"
            "h = WorkerHandle('0', target=fake_worker.serve); h.start(); print(h.fingerprint['pid'])\n")
    r = subprocess.run([sys.executable, "-c", code, str(here)], capture_output=True, text=True, timeout=60,
                       cwd=here.parents[1])
    assert r.returncode == 0, r.stderr
    import os

    pid = int(r.stdout.split()[-1])
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, f"worker {pid} outlived its parent"

"""Several devices: one worker each, a shared queue, and a slow or hung worker stalls no other."""

from __future__ import annotations

import time

from evo.measure.jobs import EvalJob
from evo.measure.run import TIMEOUT, GpuRunner
from tests.unit import fake_worker


def _job(job_id: str) -> EvalJob:
    return EvalJob(job_id, "rmsnorm", (), (), b"", (), (), (), ("normal",) * 3, (), 0)


def test_two_workers_share_the_queue_and_survive_a_hang():
    jobs = [_job(f"ok-{i}") for i in range(6)] + [_job("hang-1")] + [_job(f"ok-{i}") for i in range(6, 12)]
    with GpuRunner(devices=("0", "1"), timeout_s=2.0, target=fake_worker.serve) as runner:
        t0 = time.monotonic()
        results = runner.run(jobs)
        wall = time.monotonic() - t0
        restarts = sum(h.restarts for h in runner.handles)
    assert [r.job_id for r in results] == [j.job_id for j in jobs]
    assert results[6].error_kind == TIMEOUT
    assert all(r.error_kind == "" for i, r in enumerate(results) if i != 6)
    assert restarts == 1
    assert wall < 2.0 + 3.0  # the other worker kept draining the queue while one was stuck

"""Fake GPU workers for the watchdog tests: module-level so multiprocessing 'spawn' can pickle them.

Each speaks evo.measure.worker.serve's protocol. `serve` picks its misbehaviour from the job id:
'hang' sleeps forever, 'die' exits without a word, 'crash' reports a sticky fault then exits,
'bug' reports a harness traceback then exits; anything else gets a result stamped with the pid.
"""

from __future__ import annotations

import os
import time
from typing import Any

from evo.measure.jobs import JobResult

CEILING_GBPS = 4800.0
TRACEBACK = 'Traceback (most recent call last):\n  File "worker.py", line 1\nKeyError: \'x\''


def _pid() -> tuple[tuple[str, str], ...]:
    return (("pid", str(os.getpid())),)


def serve(conn: Any, device: str) -> None:
    """A worker that misbehaves on request."""
    conn.send(("ready", {"device": device, "pid": str(os.getpid())}, CEILING_GBPS))
    serve_jobs(conn)


def serve_jobs(conn: Any) -> None:
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if "hang" in job.job_id:
            time.sleep(3600)
        if "die" in job.job_id:
            os._exit(7)
        if "crash" in job.job_id:
            conn.send(("result", JobResult(job.job_id, "crash", "CUDA_ERROR_ILLEGAL_ADDRESS", fingerprint=_pid())))
            conn.close()
            os._exit(3)
        if "bug" in job.job_id:
            conn.send(("bug", TRACEBACK))
            conn.close()
            os._exit(4)
        conn.send(("result", JobResult(job.job_id, times_us=(1.0, 2.0, 3.0), fingerprint=_pid())))


def dead(conn: Any, device: str) -> None:
    """A worker that cannot start (no driver)."""
    conn.send(("dead", "no driver"))


def exits_at_start(conn: Any, device: str) -> None:
    """A worker that dies before saying anything."""
    os._exit(1)


def silent_at_start(conn: Any, device: str) -> None:
    """A worker that never says ready."""
    time.sleep(3600)


def _square(x: int) -> int:
    return x * x


def with_pool(conn: Any, device: str) -> None:
    """A worker that starts processes of its own, as QuACK's autotuner does (a compile pool)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        sq = pool.submit(_square, 7).result(timeout=60)
    conn.send(("ready", {"device": device, "pid": str(os.getpid()), "pool": str(sq)}, CEILING_GBPS))
    serve_jobs(conn)

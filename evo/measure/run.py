"""The parent side of GPU evaluation: a watchdog around one worker process per device.

The parent sends one EvalJob at a time and waits at most the per-candidate timeout. A worker that
hangs is killed (TIMEOUT), one that dies or reports a poisoned context is replaced (CRASH); the rest
of the batch carries on. Nothing that happens on the GPU side can crash or hang the run.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  its exit hook (which joins children) first: ours, later, runs before it
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from evo.measure.jobs import EvalJob, JobResult

TIMEOUT = "timeout"
CRASH = "crash"


class WorkerStartError(RuntimeError):
    """The worker could not start (no GPU, no driver)."""


class WorkerBugError(RuntimeError):
    """The worker raised an unexpected Python exception: a bug in the harness."""


@dataclass
class _Proc:
    proc: Any
    conn: Any


def spawn_worker(device: str, target: Callable[..., None] | None = None) -> _Proc:
    """Start a worker process (spawn: a fresh interpreter, so no CUDA state is inherited)."""
    if target is None:
        from evo.measure.worker import serve

        target = serve
    from evo.core.children import run_child

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    # run_child: the worker ignores Ctrl-C (the parent ends it) and exits if the parent dies.
    # Not daemonic: a daemonic process may not start processes, and peers do (QuACK's autotuner
    # compiles its candidate configs in a process pool); _LIVE ends workers left running at exit.
    proc = ctx.Process(target=run_child, args=(target, child, device), daemon=False)
    proc.start()
    child.close()
    _LIVE.add(proc)
    return _Proc(proc, parent)


_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _end_live_workers() -> None:
    """Kill workers nobody closed (registered after multiprocessing's own exit hook, so it runs first:
    that hook joins non-daemonic children, which would wait forever on a worker blocked on its pipe)."""
    for proc in list(_LIVE):
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


class WorkerHandle:
    """One device's worker, restarted whenever it hangs or dies."""

    def __init__(self, device: str = "0", start_timeout: float = 300.0, target: Callable[..., None] | None = None):
        self.device = device
        self.start_timeout = start_timeout
        self.target = target
        self.restarts = 0
        self.fingerprint: dict[str, str] = {}
        self.ceiling_gbps = 0.0
        self._p: _Proc | None = None

    def start(self) -> None:
        p = spawn_worker(self.device, self.target)
        if not p.conn.poll(self.start_timeout):
            _kill(p)
            raise WorkerStartError(f"GPU worker on device {self.device} did not start within {self.start_timeout:.0f} s")
        try:
            msg = p.conn.recv()
        except EOFError:
            _kill(p)
            raise WorkerStartError(f"GPU worker on device {self.device} died while starting") from None
        if msg[0] != "ready":
            _kill(p)
            raise WorkerStartError(f"GPU worker on device {self.device} could not start: {msg[1]}")
        self.fingerprint, self.ceiling_gbps = msg[1], msg[2]
        self._p = p

    def close(self) -> None:
        if self._p is not None:
            try:
                self._p.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._p.proc.join(timeout=10)
            _kill(self._p)
            self._p = None

    def kill(self) -> None:
        """End the worker now, whatever it is doing (an interrupted run does not wait for its job)."""
        if self._p is not None:
            _kill(self._p)
            self._p = None

    def _restart(self) -> None:
        if self._p is not None:
            _kill(self._p)
            self._p = None
        self.restarts += 1
        self.start()

    def submit(self, job: EvalJob, timeout: float) -> JobResult:
        """Run one job; a hang becomes a TIMEOUT record, a death a CRASH record."""
        if self._p is None:
            self.start()
        assert self._p is not None
        t0 = time.monotonic()
        try:
            self._p.conn.send(job)
            ready = self._p.conn.poll(timeout)
        except (BrokenPipeError, EOFError, OSError) as e:
            self._restart()
            return JobResult(job.job_id, CRASH, f"worker pipe broke: {e}")
        if not ready:
            self._restart()
            return JobResult(job.job_id, TIMEOUT, f"no answer within {timeout:.1f} s (worker killed)")
        try:
            tag, res = self._p.conn.recv()
        except (EOFError, OSError):
            self._p.proc.join(timeout=2.0)  # reap it, so the exit code (or signal) is known
            code = self._p.proc.exitcode
            self._restart()
            return JobResult(job.job_id, CRASH, f"worker died (exit code {code}) after {time.monotonic() - t0:.1f} s")
        if tag == "bug":
            self._restart()
            raise WorkerBugError(f"the GPU worker failed on job {job.job_id} (a harness bug, not the candidate):\n{res}")
        if res.error_kind == CRASH:  # the worker exits after a sticky CUDA error
            self._restart()
        return res


def _kill(p: _Proc) -> None:
    if p.proc.is_alive():
        p.proc.kill()
    p.proc.join(timeout=10)
    p.conn.close()


class GpuRunner:
    """Runs jobs on one worker per device; only the caller writes the store."""

    def __init__(self, devices: Sequence[str] = ("0",), timeout_s: float = 60.0, target: Callable[..., None] | None = None):
        self.handles = [WorkerHandle(d, target=target) for d in devices]
        self.timeout_s = timeout_s

    def __enter__(self) -> "GpuRunner":
        for h in self.handles:
            h.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        for h in self.handles:
            if exc_type is None:
                h.close()
            else:  # interrupted or failed: a worker busy with a job would keep us waiting
                h.kill()

    @property
    def fingerprint(self) -> dict[str, str]:
        return self.handles[0].fingerprint

    @property
    def ceiling_gbps(self) -> float:
        return self.handles[0].ceiling_gbps

    def run(self, jobs: Sequence[EvalJob], on_result: Callable[[JobResult], None] | None = None) -> list[JobResult]:
        """Results in job order. With several devices, one thread per worker takes jobs from a shared
        queue, so a slow or restarting worker stalls no other; the caller alone writes the store."""
        if len(self.handles) == 1:
            out = []
            for job in jobs:
                r = self.handles[0].submit(job, self.timeout_s)
                if on_result:
                    on_result(r)
                out.append(r)
            return out
        import queue
        import threading

        todo: queue.Queue[int] = queue.Queue()
        for i in range(len(jobs)):
            todo.put(i)
        results: list[JobResult | None] = [None] * len(jobs)
        errors: list[BaseException] = []
        lock = threading.Lock()

        def drain(h: WorkerHandle) -> None:
            while not errors:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    r = h.submit(jobs[i], self.timeout_s)
                except BaseException as e:  # a harness bug: stop every thread, re-raise in the caller
                    errors.append(e)
                    return
                results[i] = r
                if on_result:
                    with lock:
                        on_result(r)

        threads = [threading.Thread(target=drain, args=(h,), daemon=True) for h in self.handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]


def visible_devices() -> list[str]:
    """Device ids this process may use: CUDA_VISIBLE_DEVICES, else every device the driver reports."""
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import subprocess
    import sys

    code = "from cuda.bindings import driver as d\nd.cuInit(0)\nprint(d.cuDeviceGetCount()[1])"
    try:
        n = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return ["0"]
    return [str(i) for i in range(max(1, n))]


def gpu_available() -> bool:
    """True when an NVIDIA driver and at least one device are visible (checked in a subprocess)."""
    import subprocess
    import sys

    code = (
        "from cuda.bindings import driver as d\n"
        "e,=d.cuInit(0)\n"
        "assert e==d.CUresult.CUDA_SUCCESS\n"
        "e,n=d.cuDeviceGetCount()\n"
        "assert e==d.CUresult.CUDA_SUCCESS and n>0\n"
    )
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False

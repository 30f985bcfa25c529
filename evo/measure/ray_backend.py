"""The build and run stages on a Ray cluster, behind the Builder and GpuRunner interfaces.

Compiles are Ray CPU tasks around the pure `compile_one`. GPU evaluation runs in one actor per GPU;
each actor owns a local WorkerHandle, so the watchdog (kill and restart on a hang or a death) works
inside the actor exactly as it does locally. The driver hands out one job at a time per actor from a
queue, so a slow, restarting or dead actor stalls no other; it merges results in job order and is
the only process that writes the store (the runner never touches it). Ray is imported lazily: it is
the optional extra `kernel-factory[ray]`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from evo.build.nvrtc import BuildInput, BuildResult, compile_one
from evo.measure.jobs import EvalJob, JobResult
from evo.measure.run import CRASH, TIMEOUT, WorkerHandle, WorkerStartError
from evo.core.extras import require
from evo.core.status import Status

STARTING = -1  # job index of a wait that is an actor coming up, not a job


def _ray() -> Any:
    return require("ray", "ray", "the Ray backend")


def _require_ray() -> Any:
    ray = _ray()
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialized: call evo.measure.ray_backend.init_ray(address) first")
    return ray


def init_ray(address: str, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Connect to the cluster at `address`, or start a local instance on 127.0.0.1 when it is ''."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    # A private instance on a workstation: no usage reports sent anywhere, no dashboard.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, num_gpus=num_gpus,
             _node_ip_address="127.0.0.1", log_to_driver=False)


def shutdown_ray() -> None:
    """Leave the cluster (a local instance that init_ray started stops with it)."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


class RayBuilder:
    """Compiles batches as Ray CPU tasks (one per input), skipping what is already cached (by build key)."""

    def __init__(self, cached: Mapping[str, BuildResult] | None = None, timeout_s: float = 60.0) -> None:
        ray = _require_ray()
        self._cache: dict[str, BuildResult] = dict(cached or {})
        self.timeout_s = timeout_s
        self.compiled = 0  # inputs sent to a compile task
        # One retry covers a lost node; a source that crashes NVRTC should not cost four compiles.
        self._compile = ray.remote(num_cpus=1, max_retries=1)(compile_one)

    def __enter__(self) -> "RayBuilder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is held between batches: build() waits for all of its tasks."""

    def has(self, key: str) -> bool:
        """True when the result for this build key is cached (no compile needed)."""
        return key in self._cache

    def remember(self, results: Iterable[BuildResult]) -> None:
        """Cache results built elsewhere (e.g. read back from the store); a key already cached is kept."""
        for r in results:
            self._cache.setdefault(r.build_key, r)

    def build(self, inputs: Sequence[BuildInput]) -> list[BuildResult]:
        """Results in input order; identical inputs in one batch compile once."""
        ray = _ray()
        keys = [bi.key() for bi in inputs]
        todo = {k: bi for k, bi in zip(keys, inputs) if k not in self._cache}
        refs = {k: self._compile.remote(bi) for k, bi in todo.items()}
        self.compiled += len(refs)
        for k, ref in refs.items():
            try:
                # Waited for in order: by the time one is waited for, the ones before it have finished,
                # so each gets at least timeout_s of its own once the CPUs are free.
                r = ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)  # kills the worker process running NVRTC
                r = BuildResult(k, Status.COMPILE_ERROR, error=f"NVRTC compile exceeded {self.timeout_s:g} s")
            except ray.exceptions.WorkerCrashedError as e:  # NVRTC took its process down: the source's fault
                r = BuildResult(k, Status.COMPILE_ERROR, error=f"the compiler process died: {e}"[:500])
            self._cache[r.build_key] = r
        return [self._cache[k] for k in keys]


class GpuActor:
    """Lives in a Ray actor: one device's WorkerHandle (the watchdog runs here, next to the GPU)."""

    def __init__(self, label: str, start_timeout: float, target: Callable[..., None] | None) -> None:
        import ray

        # Ray sets CUDA_VISIBLE_DEVICES of this process to the GPUs it granted; the worker needs the same.
        device = ",".join(str(g) for g in ray.get_gpu_ids()) or label
        self.handle = WorkerHandle(device, start_timeout, target)
        self.handle.start()

    def info(self) -> tuple[dict[str, str], float]:
        return self.handle.fingerprint, self.handle.ceiling_gbps

    def submit(self, job: EvalJob, timeout: float) -> JobResult:
        return self.handle.submit(job, timeout)

    def restarts(self) -> int:
        return self.handle.restarts

    def actor_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_actor_id()

    def close(self) -> None:
        self.handle.close()


@dataclass(frozen=True)
class _Wait:
    slot: int
    index: int  # a job index, or STARTING
    deadline: float


class RayRunner:
    """Runs jobs on one Ray actor per GPU; only the caller writes the store."""

    def __init__(self, num_actors: int | None = None, timeout_s: float = 60.0,
                 worker_target: Callable[..., None] | None = None, num_gpus_per_actor: float = 1.0,
                 start_timeout: float = 300.0, deadline_s: float | None = None) -> None:
        ray = _require_ray()
        if num_actors is None:
            gpus = ray.cluster_resources().get("GPU", 0.0)
            num_actors = int(gpus // num_gpus_per_actor) if num_gpus_per_actor > 0 else 0
            if num_actors < 1:
                raise WorkerStartError(f"the Ray cluster has {gpus:g} GPUs: not enough for one actor "
                                       f"with num_gpus={num_gpus_per_actor:g}")
        self.num_actors = num_actors
        self.timeout_s = timeout_s
        self.start_timeout = start_timeout
        self.start_deadline_s = start_timeout + 30.0
        # WorkerHandle.submit takes at most the job timeout plus one worker restart; past this deadline
        # the actor itself is stuck (node lost, process wedged) and is killed and replaced.
        self.deadline_s = deadline_s if deadline_s is not None else timeout_s + self.start_deadline_s
        self.replaced = 0  # actors replaced after dying or missing their deadline
        self.lost: list[str] = []  # why a slot was given up (its replacement could not start)
        self._cls = ray.remote(num_gpus=num_gpus_per_actor, max_restarts=0)(GpuActor)
        self._target = worker_target
        self._actors: list[Any] = []
        self._fingerprint: dict[str, str] = {}
        self._ceiling = 0.0

    def __enter__(self) -> "RayRunner":
        ray = _ray()
        self._actors = [self._new_actor(i) for i in range(self.num_actors)]
        try:
            infos = ray.get([a.info.remote() for a in self._actors], timeout=self.start_deadline_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self.__exit__()
            raise WorkerStartError(f"a GPU actor could not start: {e}") from e
        self._fingerprint, self._ceiling = infos[0]
        return self

    def __exit__(self, *exc: object) -> None:
        ray = _ray()
        for a in self._actors:
            if a is None:
                continue
            try:  # let the worker leave through its protocol (and release the GPU) before the actor goes
                ray.get(a.close.remote(), timeout=30.0)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass  # already dead or stuck: the kill below is all that is left to do
            ray.kill(a, no_restart=True)
        self._actors = []

    @property
    def fingerprint(self) -> dict[str, str]:
        return self._fingerprint

    @property
    def ceiling_gbps(self) -> float:
        return self._ceiling

    def worker_restarts(self) -> list[int]:
        """How often each live actor restarted its worker process (watchdog restarts)."""
        ray = _ray()
        return ray.get([a.restarts.remote() for a in self._actors if a is not None])

    def actor_ids(self) -> list[str]:
        """Ray actor ids by slot ('' where a slot was given up)."""
        ray = _ray()
        return [ray.get(a.actor_id.remote()) if a is not None else "" for a in self._actors]

    def _new_actor(self, slot: int) -> Any:
        return self._cls.remote(str(slot), self.start_timeout, self._target)

    def run(self, jobs: Sequence[EvalJob], on_result: Callable[[JobResult], None] | None = None) -> list[JobResult]:
        """Results in job order; on_result sees each as it arrives. An actor that dies costs its job (CRASH)."""
        ray = _ray()
        todo = deque(range(len(jobs)))
        results: list[JobResult | None] = [None] * len(jobs)
        waiting: dict[Any, _Wait] = {}

        def give(slot: int) -> None:
            if todo:
                i = todo.popleft()
                ref = self._actors[slot].submit.remote(jobs[i], self.timeout_s)
                waiting[ref] = _Wait(slot, i, time.monotonic() + self.deadline_s)

        def replace(slot: int) -> None:
            ray.kill(self._actors[slot], no_restart=True)
            self._actors[slot] = self._new_actor(slot)
            self.replaced += 1
            waiting[self._actors[slot].info.remote()] = _Wait(slot, STARTING, time.monotonic() + self.start_deadline_s)

        def finish(i: int, r: JobResult) -> None:
            results[i] = r
            if on_result:
                on_result(r)

        self._check_alive(todo)
        for slot, a in enumerate(self._actors):
            if a is not None:
                give(slot)
        while waiting:
            wait_s = max(0.0, min(w.deadline for w in waiting.values()) - time.monotonic())
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=wait_s)
            if not ready:
                for ref, w in [(ref, w) for ref, w in waiting.items() if w.deadline <= time.monotonic()]:
                    del waiting[ref]
                    if w.index == STARTING:
                        self._give_up(w.slot, f"no answer within {self.start_deadline_s:.0f} s of starting")
                    else:
                        finish(w.index, JobResult(jobs[w.index].job_id, TIMEOUT,
                                                  f"GPU actor gave no answer within {self.deadline_s:.1f} s "
                                                  "(actor killed and replaced)"))
                        replace(w.slot)
                self._check_alive(todo)
                continue
            w = waiting.pop(ready[0])
            try:
                value = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                if w.index == STARTING:
                    self._give_up(w.slot, f"its replacement could not start: {e}")
                    self._check_alive(todo)
                    continue
                finish(w.index, JobResult(jobs[w.index].job_id, CRASH, f"GPU actor died: {_first_line(e)}"))
                replace(w.slot)
                continue
            if w.index != STARTING:
                finish(w.index, value)
            give(w.slot)
        return [r for r in results if r is not None]

    def _give_up(self, slot: int, why: str) -> None:
        ray = _ray()
        ray.kill(self._actors[slot], no_restart=True)
        self._actors[slot] = None
        self.lost.append(f"slot {slot}: {why}")

    def _check_alive(self, todo: deque) -> None:
        if todo and all(a is None for a in self._actors):
            raise WorkerStartError("every GPU actor is gone: " + "; ".join(self.lost))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:500]

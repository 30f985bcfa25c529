"""Compile rendered CUDA C++ to cubins with NVRTC (through cuda.core), in a process pool.

No GPU is needed: NVRTC builds sm_90a and sm_100a cubins on any machine. The `ptxas -v` report gives
registers, spills, stack and shared memory per kernel, a free filter before the GPU sees anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from evo.genome import Genome
from evo.render import render
from evo.status import Status
from evo.template import TemplateDef

# Hopper and Blackwell datacenter limits: 64K registers per SM, 255 per thread, 227 KB smem per block.
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
MAX_SMEM_PER_BLOCK = 232448
NVRTC_STD = "c++17"

_ENTRY = re.compile(r"Compiling entry function '(?P<k>[^']+)' for '(?P<arch>[^']+)'")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<smem>\d+) bytes smem)?")


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one kernel."""

    regs: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Per-kernel resources from a `ptxas -v` report."""
    out: dict[str, KernelResources] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group("k")
            out[current] = KernelResources()
        elif current and (m := _FRAME.search(line)):
            out[current] = replace(
                out[current],
                stack_bytes=int(m.group("stack")),
                spill_stores=int(m.group("st")),
                spill_loads=int(m.group("ld")),
            )
        elif current and (m := _USED.search(line)):
            out[current] = replace(
                out[current], regs=int(m.group("regs")), smem_bytes=int(m.group("smem") or 0)
            )
    return out


@lru_cache(maxsize=1)
def compiler_version() -> str:
    """'nvrtc-13.5' style version string of the NVRTC library in use."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return f"nvrtc-{major}.{minor}"


@lru_cache(maxsize=1)
def include_dir() -> str:
    """CUDA headers for NVRTC: from the pip wheels (cuda.pathfinder) or $CUDA_HOME."""
    import cuda.pathfinder

    path = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if path is None:
        raise RuntimeError("no CUDA headers found: install cuda-toolkit[cudart,nvrtc,cccl] or set CUDA_HOME")
    return path


@dataclass(frozen=True)
class BuildInput:
    """One compile: a genome rendered for one arch, dtype assignment and set of specialized dims."""

    genome: Genome
    arch: str  # e.g. "sm_90a"
    dtypes: tuple[tuple[str, str], ...]
    consts: tuple[tuple[str, int], ...]
    source: str = field(default="", compare=False, repr=False)
    kernels: tuple[str, ...] = ()
    threads: int = 0  # largest block of the plan, for the register check
    render_error: str = ""

    def key(self) -> str:
        """Cache key: genome key + arch + dtypes + consts + compiler version + flags."""
        payload = json.dumps(
            [self.genome.key(), self.arch, list(self.dtypes), list(self.consts), compiler_version(), NVRTC_STD],
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    @property
    def arch_number(self) -> int:
        return int(re.sub(r"\D", "", self.arch))


@dataclass(frozen=True)
class BuildResult:
    """The outcome of one compile; a failure is a record, never an exception."""

    build_key: str
    status: Status
    resources: tuple[tuple[str, KernelResources], ...] = ()
    cubin: bytes = field(default=b"", repr=False)
    log: str = field(default="", repr=False)
    error: str = ""
    compile_ms: float = 0.0
    compiler: str = ""

    @property
    def regs(self) -> int:
        return max((r.regs for _, r in self.resources), default=0)

    @property
    def spill_stores(self) -> int:
        return max((r.spill_stores for _, r in self.resources), default=0)

    @property
    def spill_loads(self) -> int:
        return max((r.spill_loads for _, r in self.resources), default=0)

    @property
    def smem_bytes(self) -> int:
        return max((r.smem_bytes for _, r in self.resources), default=0)

    @property
    def stack_bytes(self) -> int:
        return max((r.stack_bytes for _, r in self.resources), default=0)


def prepare(
    tdef: TemplateDef, genome: Genome, arch: str, dtypes: Mapping[str, Any], dims: Mapping[str, int]
) -> BuildInput:
    """Render a genome for one cell's dtypes (and the dims the template specializes on)."""
    consts = {d: int(dims[d]) for d in tdef.specialize}
    dt = tuple(sorted((k, getattr(v, "value", v)) for k, v in dtypes.items()))
    bi = BuildInput(genome, arch, dt, tuple(sorted(consts.items())))
    arch_n = bi.arch_number
    r = render(tdef, genome.params_dict(), arch_n, dict(dt), consts)
    if not r.status.ok:
        return replace(bi, render_error=r.error)
    if genome.text is not None:  # LLM-written: the rendered CUDA must still be device code only
        from evo.llm.safety import cuda_problems

        problems = cuda_problems(r.source)
        if problems:
            return replace(bi, render_error="unsafe rendered CUDA: " + "; ".join(problems))
    # The register check needs the block size; one that reads a dim is checked per cell at launch.
    ctx = tdef.context(genome.params_dict(), arch_n, dict(dt), consts)
    threads = max(
        (_product(e.eval(ctx) for e in d.block) for d in tdef.launches if all(e.names <= set(ctx) for e in d.block)),
        default=0,
    )
    return replace(bi, source=r.source, kernels=tdef.kernel_names(), threads=threads)


def _product(vals: Iterable[Any]) -> int:
    p = 1
    for v in vals:
        p *= int(v)
    return p


def compile_one(bi: BuildInput) -> BuildResult:
    """Compile one prepared input; runs in a pool worker."""
    key = bi.key()
    version = compiler_version()
    if bi.render_error:
        return BuildResult(key, Status.RENDER_ERROR, error=bi.render_error, compiler=version)
    from cuda.core import Program, ProgramOptions
    from cuda.core._utils.cuda_utils import NVRTCError

    opts = ProgramOptions(arch=bi.arch, std=NVRTC_STD, include_path=[include_dir()], ptxas_options=["-v"])
    buf = io.StringIO()
    t0 = time.perf_counter()
    try:
        obj = Program(bi.source, code_type="c++", options=opts).compile("cubin", logs=buf)
    except NVRTCError as e:
        ms = (time.perf_counter() - t0) * 1e3
        log = str(e.args[0] if e.args else e).replace("\x00", "")
        return BuildResult(key, Status.COMPILE_ERROR, log=log, error=_first_error(log), compile_ms=ms, compiler=version)
    ms = (time.perf_counter() - t0) * 1e3
    log = buf.getvalue().replace("\x00", "")
    res = parse_ptxas(log)
    # Some cuda.core releases hand back no ptxas report on success; then resources stay unknown (0)
    # and a missing kernel surfaces as a LAUNCH_ERROR on the GPU instead.
    missing = [k for k in bi.kernels if k not in res] if res else []
    if missing:
        return BuildResult(
            key, Status.COMPILE_ERROR, log=log, error=f"kernels not in the cubin: {missing}", compile_ms=ms, compiler=version
        )
    status, error = check_resources(res, bi.threads)
    return BuildResult(key, status, tuple(sorted(res.items())), obj.code, log, error, ms, version)


def check_resources(res: Mapping[str, KernelResources], threads: int) -> tuple[Status, str]:
    """RESOURCE_ERROR when a kernel cannot launch with its block size on the target."""
    for name, r in res.items():
        if threads and r.regs * threads > REGS_PER_SM:
            return Status.RESOURCE_ERROR, f"{name}: {r.regs} regs x {threads} threads > {REGS_PER_SM}"
        if r.smem_bytes > MAX_SMEM_PER_BLOCK:
            return Status.RESOURCE_ERROR, f"{name}: {r.smem_bytes} B static smem > {MAX_SMEM_PER_BLOCK}"
    return Status.OK, ""


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:500]
    return log.strip().splitlines()[0][:500] if log.strip() else "compile failed with an empty log"


class Builder:
    """Compiles batches in a process pool, skipping what is already cached (by build key)."""

    def __init__(self, workers: int = 2, cached: Mapping[str, BuildResult] | None = None) -> None:
        self.workers = max(1, workers)
        self._cache: dict[str, BuildResult] = dict(cached or {})
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def build(self, inputs: Sequence[BuildInput]) -> list[BuildResult]:
        """Results in input order; identical inputs in one batch compile once."""
        keys = [bi.key() for bi in inputs]
        todo = {k: bi for k, bi in zip(keys, inputs) if k not in self._cache}
        if todo:
            if self.workers == 1 or len(todo) == 1:
                results = [compile_one(bi) for bi in todo.values()]
            else:
                if self._pool is None:
                    import multiprocessing as mp

                    self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
                results = list(self._pool.map(compile_one, todo.values(), chunksize=4))
            for r in results:
                self._cache[r.build_key] = r
        return [self._cache[k] for k in keys]

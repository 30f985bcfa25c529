"""Compile rendered CUDA C++ to cubins with NVRTC (through cuda.core), in compile processes.

No GPU is needed: NVRTC builds sm_90a and sm_100a cubins on any machine. The `ptxas -v` report gives
registers, spills, stack and shared memory per kernel, a free filter before the GPU sees anything.
Every compile runs in a child process with a wall-clock limit: a template that keeps NVRTC busy for
minutes (exponential template instantiation, a huge unroll) is killed and recorded as COMPILE_ERROR.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import re
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from evo.build import cache as build_cache
from evo.build.cubin import CubinError, cubin_regcounts
from evo.core.genome import Genome
from evo.templates.render import render
from evo.templates.safety import cuda_problems
from evo.core.status import Status
from evo.templates.template import TemplateDef, TemplateError

# Hopper and Blackwell datacenter limits: 64K registers per SM, 255 per thread, 227 KB smem per block.
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
MAX_SMEM_PER_BLOCK = 232448
NVRTC_STD = "c++17"
DEFAULT_TIMEOUT_S = 60.0  # per compile; [build] timeout_s
START_TIMEOUT_S = 120.0  # a fresh compile process imports cuda.core and loads NVRTC before its first input

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


_PROPS = re.compile(r"Function properties for (?P<f>\S+)")


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Per-kernel resources from a `ptxas -v` report. A "Function properties" line names the function its frame line
    belongs to: an entry's own frame sets its stack and spills. A device function ptxas kept out of line (its
    properties printed inside an entry's block) is not an entry; its spills are added to every entry of the
    program, which may call it (the report has no call graph), so a spill anywhere is never hidden."""
    out: dict[str, KernelResources] = {}
    current = props = None
    callee_st = callee_ld = 0
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = props = m.group("k")
            out[current] = KernelResources()
        elif m := _PROPS.search(line):
            props = m.group("f")
        elif m := _FRAME.search(line):
            if current is not None and props == current:
                out[current] = replace(out[current], stack_bytes=int(m.group("stack")),
                                       spill_stores=int(m.group("st")), spill_loads=int(m.group("ld")))
            else:
                callee_st += int(m.group("st"))
                callee_ld += int(m.group("ld"))
        elif current and (m := _USED.search(line)):
            out[current] = replace(
                out[current], regs=int(m.group("regs")), smem_bytes=int(m.group("smem") or 0)
            )
    if callee_st or callee_ld:
        out = {k: replace(r, spill_stores=r.spill_stores + callee_st, spill_loads=r.spill_loads + callee_ld)
               for k, r in out.items()}
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
    threads: int = 0  # largest block of the plan
    kernel_threads: tuple[tuple[str, int], ...] = ()  # each kernel's largest block, for the register check
    render_error: str = ""

    def key(self) -> str:
        """Cache key: genome key + arch + dtypes + consts + compiler version + flags + the rendered source. The
        genome key hashes the template's own text only; the rendering also holds its includes (templates/_macros),
        so an edited include gives new build keys: no stored cubin or measurement of the old code is reused."""
        payload = json.dumps(
            [self.genome.key(), self.arch, list(self.dtypes), list(self.consts), compiler_version(), NVRTC_STD,
             hashlib.sha256(self.source.encode()).hexdigest()],
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
    consts = tdef.consts(dims)
    dt = tuple(sorted((k, getattr(v, "value", v)) for k, v in dtypes.items()))
    bi = BuildInput(genome, arch, dt, tuple(sorted(consts.items())))
    arch_n = bi.arch_number
    r = render(tdef, genome.params_dict(), arch_n, dict(dt), consts)
    if not r.status.ok:
        return replace(bi, render_error=r.error)
    # Keyed on the template, not the genome: a genome drawn fresh, switched to, or rebuilt from the
    # store at resume carries no text, yet renders the LLM's template all the same.
    if not tdef.trusted or genome.text is not None:  # the rendered CUDA must still be device code only
        problems = cuda_problems(r.source)
        if problems:
            return replace(bi, render_error="unsafe rendered CUDA: " + "; ".join(problems))
    # The register check needs the block size; one that reads a dim is checked per cell at launch.
    ctx = tdef.context(genome.params_dict(), arch_n, dict(dt), consts)
    try:  # a launch's `when` is decided by what the build knows (params, arch, dtypes, specialized dims)
        kernels = tdef.kernel_names(ctx)
    except TemplateError as e:
        return replace(bi, render_error=f"a launch's `when` cannot be decided at build time: {e}")
    per: dict[str, int] = {}
    for d in tdef.launches:
        if d.kernel in kernels and all(e.names <= set(ctx) for e in d.block):
            per[d.kernel] = max(per.get(d.kernel, 0), _product(e.eval(ctx) for e in d.block))
    return replace(bi, source=r.source, kernels=kernels, threads=max(per.values(), default=0),
                   kernel_threads=tuple(sorted(per.items())))


def build_point(tdef: TemplateDef, params: Mapping[str, Any], dtypes: Mapping[str, Any], dims: Mapping[str, int],
                arch: str = "sm_90a") -> BuildResult:
    """One build of tdef at its defaults updated by `params`, for a cell's dtypes and dims (a script's or a test's
    build, outside a run); ValueError naming a param tdef does not have, or the constraints the point breaks there."""
    g = Genome.make(tdef.op, tdef.name, tdef.source_hash, tdef.complete(params))
    bad = tdef.violations(g.params_dict(), int(re.sub(r"\D", "", arch)), dtypes, dims)
    if bad:
        raise ValueError(f"{tdef.op}/{tdef.name} at {dict(params)} breaks {bad}")
    return compile_one(prepare(tdef, g, arch, dtypes, dims))


def _product(vals: Iterable[Any]) -> int:
    p = 1
    for v in vals:
        p *= int(v)
    return p


def resources_of(log: str, cubin: bytes) -> dict[str, KernelResources]:
    """Per-kernel resources from ptxas's report, or where there is none, the registers from the cubin itself.
    Some cuda.core releases hand back no report on success (cuda.core 1.2.0 with NVRTC 13.0 on the H200 image,
    for some programs), and a build read back from the store has only its log: evo/build/cubin.py reads each
    kernel's register count from the cubin's .nv.info. Spills and stack then stay unknown (0)."""
    res = parse_ptxas(log)
    if not res and cubin:
        try:
            res = {k: KernelResources(regs=n) for k, n in cubin_regcounts(cubin).items()}
        except CubinError:  # bytes that are not a cubin: unknown, and the driver will say so at load
            return {}
    return res


def compile_one(bi: BuildInput) -> BuildResult:
    """Compile one prepared input; runs in a compile process (or a Ray task). NVRTC's answer comes from the build
    cache ($KF_BUILD_CACHE, evo/build/cache.py) when it holds this build key."""
    key = bi.key()
    version = compiler_version()
    if bi.render_error:
        return BuildResult(key, Status.RENDER_ERROR, error=bi.render_error, compiler=version)
    out = build_cache.load(key)
    if out is None:
        out = _nvrtc(bi)
        build_cache.store(key, out)
    if not out.ok:
        return BuildResult(key, Status.COMPILE_ERROR, log=out.log, error=_first_error(out.log),
                           compile_ms=out.compile_ms, compiler=version)
    res = resources_of(out.log, out.cubin)
    missing = [k for k in bi.kernels if k not in res] if res else []
    if missing:
        return BuildResult(key, Status.COMPILE_ERROR, log=out.log, error=f"kernels not in the cubin: {missing}",
                           compile_ms=out.compile_ms, compiler=version)
    status, error = check_resources(res, dict(bi.kernel_threads) or bi.threads)
    return BuildResult(key, status, tuple(sorted(res.items())), out.cubin, out.log, error, out.compile_ms, version)


def _nvrtc(bi: BuildInput) -> build_cache.Compiled:
    """NVRTC's answer for one input: the cubin and ptxas's report, or the log of a refused compile."""
    from cuda.core import Program, ProgramOptions
    from cuda.core._utils.cuda_utils import NVRTCError

    opts = ProgramOptions(arch=bi.arch, std=NVRTC_STD, include_path=[include_dir()], ptxas_options=["-v"])
    buf = io.StringIO()
    t0 = time.perf_counter()
    try:
        obj = Program(bi.source, code_type="c++", options=opts).compile("cubin", logs=buf)
    except NVRTCError as e:
        log = str(e.args[0] if e.args else e).replace("\x00", "")
        return build_cache.Compiled(False, b"", log, (time.perf_counter() - t0) * 1e3)
    ms = (time.perf_counter() - t0) * 1e3
    return build_cache.Compiled(True, bytes(obj.code), buf.getvalue().replace("\x00", ""), ms)


def check_resources(res: Mapping[str, KernelResources], threads: int | Mapping[str, int]) -> tuple[Status, str]:
    """RESOURCE_ERROR when a kernel cannot launch with its block size on the target. `threads`: one
    block size for every kernel, or each kernel's own (a plan's launches may differ)."""
    for name, r in res.items():
        n = threads.get(name, 0) if isinstance(threads, Mapping) else threads
        if n and r.regs * n > REGS_PER_SM:
            return Status.RESOURCE_ERROR, f"{name}: {r.regs} regs x {n} threads > {REGS_PER_SM}"
        if r.smem_bytes > MAX_SMEM_PER_BLOCK:
            return Status.RESOURCE_ERROR, f"{name}: {r.smem_bytes} B static smem > {MAX_SMEM_PER_BLOCK}"
    return Status.OK, ""


# cuda.core's NVRTCError starts the log with NVRTC's result: "6: NVRTC_ERROR_COMPILATION, compilation log:".
_RESULT_LINE = re.compile(r"\d+: NVRTC_ERROR_\w+, compilation log:")
# a diagnostic: "default_program(499): error: ...", "error #20-D: ...", "ptxas error   : ...", "ptxas fatal   : ..."
_DIAGNOSTIC = re.compile(r"\b(?:error|fatal)\b(?:\s*#[\w-]+)?\s*:", re.IGNORECASE)


def _first_error(log: str) -> str:
    """The line of a failed compile's log that says what went wrong: the first diagnostic, else the first line
    that names an error (NVRTC's result line only when nothing else does), else the first line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    body = [line for line in lines if not _RESULT_LINE.fullmatch(line)]
    for line in body:
        if _DIAGNOSTIC.search(line):
            return line[:500]
    for line in body + lines:
        if "error" in line.lower():
            return line[:500]
    return lines[0][:500] if lines else "compile failed with an empty log"


def _serve(conn: Any, nvrtc: str | None = None) -> None:
    """A compile process: answers each BuildInput with ("ok", BuildResult) until it reads None. With
    `nvrtc` (a folder, see evo.build.nvrtc_lib), that NVRTC instead of the installed one."""
    from evo.core.children import become_child

    become_child()
    try:
        if nvrtc is not None:
            from evo.build.nvrtc_lib import find_nvrtc, load_nvrtc

            lib = find_nvrtc(Path(nvrtc))
            load_nvrtc(lib)
            if compiler_version() != lib.version:
                raise RuntimeError(f"loaded {lib.nvrtc} ({lib.version}), but NVRTC says {compiler_version()}")
        import cuda.core  # noqa: F401  (loaded before the first deadline starts)

        compiler_version()
        include_dir()
        conn.send(("ready", None))
        while (bi := conn.recv()) is not None:
            conn.send(("ok", compile_one(bi)))
    except (EOFError, BrokenPipeError):
        return  # the builder went away
    except Exception:  # noqa: BLE001  (no headers, a bug: not the candidate's fault; the builder raises it)
        conn.send(("bug", traceback.format_exc()))


@dataclass
class _Compiler:
    """One compile process the builder can kill, and the input it is working on."""

    proc: Any
    conn: Any
    deadline: float  # for starting, then for the current input
    ready: bool = False
    key: str = ""
    job: BuildInput | None = None
    sent: float = 0.0

    @classmethod
    def start(cls, nvrtc: str | None = None) -> _Compiler:
        ctx = mp.get_context("spawn")  # a fresh interpreter: nothing of the parent's state is inherited
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, nvrtc), daemon=True)
        proc.start()
        child.close()
        return cls(proc, parent, time.monotonic() + START_TIMEOUT_S)

    @property
    def waiting(self) -> bool:
        return not self.ready or self.job is not None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()


class Builder:
    """Compiles batches in `workers` compile processes, skipping what is already cached (by build key).

    Each compile may take `timeout_s` of wall clock; past it, its process is killed (the input is a
    COMPILE_ERROR) and a fresh one takes over the rest of the batch. With `nvrtc` (a folder holding
    another NVRTC, see evo.build.nvrtc_lib) the compile processes use that one: each result's
    `compiler` and `build_key` are then that NVRTC's, while the batch is keyed as this process keys it.
    """

    def __init__(self, workers: int = 2, cached: Mapping[str, BuildResult] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, nvrtc: str | None = None) -> None:
        if not 0 < timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be > 0 and finite, got {timeout_s}")
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self.nvrtc = nvrtc
        self._cache: dict[str, BuildResult] = dict(cached or {})
        self._procs: list[_Compiler] = []
        self.compiled = 0  # inputs handed to NVRTC (timeouts and crashes included)

    def has(self, key: str) -> bool:
        """True when the result for this build key is cached (no compile needed)."""
        return key in self._cache

    def remember(self, results: Iterable[BuildResult]) -> None:
        """Cache results built elsewhere (e.g. read back from the store); a key already cached is kept."""
        for r in results:
            self._cache.setdefault(r.build_key, r)

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        idle = [c for c in self._procs if not c.waiting]  # the others are killed at once
        for c in idle:
            try:
                c.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for c in idle:
            c.proc.join(timeout=5)
        for c in self._procs:
            c.kill()
        self._procs = []

    def build(self, inputs: Sequence[BuildInput]) -> list[BuildResult]:
        """Results in input order; identical inputs in one batch compile once."""
        keys = [bi.key() for bi in inputs]
        todo = {k: bi for k, bi in zip(keys, inputs) if k not in self._cache}
        pending: deque[tuple[str, BuildInput]] = deque()
        for k, bi in todo.items():
            if bi.render_error:  # nothing to compile
                self._cache[k] = compile_one(bi)
            else:
                pending.append((k, bi))
        if pending:
            try:
                self._compile(pending)
            except BaseException:
                self.close()  # its processes may hold inputs whose answers nobody will read
                raise
        return [self._cache[k] for k in keys]

    def _compile(self, pending: deque[tuple[str, BuildInput]]) -> None:
        from multiprocessing.connection import wait

        while pending or any(c.job is not None for c in self._procs):
            busy = sum(c.job is not None for c in self._procs)
            while len(self._procs) < min(self.workers, busy + len(pending)):
                self._procs.append(_Compiler.start(self.nvrtc))
            now = time.monotonic()
            for c in list(self._procs):
                if c.ready and c.job is None and pending:
                    if not c.proc.is_alive():  # died while idle: replaced on the next pass
                        self._drop(c)
                        continue
                    c.key, c.job = pending.popleft()
                    self.compiled += 1
                    try:
                        c.conn.send(c.job)
                    except (BrokenPipeError, OSError):  # it died before taking the input: give it to another
                        self.compiled -= 1
                        pending.appendleft((c.key, c.job))
                        self._drop(c)
                        continue
                    c.sent, c.deadline = now, now + self.timeout_s
            waiting = [c for c in self._procs if c.waiting]
            if not waiting:
                continue
            for conn in wait([c.conn for c in waiting], max(0.0, min(c.deadline for c in waiting) - now)):
                self._answer(next(c for c in waiting if c.conn is conn))
            now = time.monotonic()
            for c in [c for c in self._procs if c.waiting and now >= c.deadline]:
                if not c.ready:
                    self._drop(c)
                    raise RuntimeError(f"a compile process did not start within {START_TIMEOUT_S:.0f} s")
                self._finish(c, BuildResult(c.key, Status.COMPILE_ERROR, error=f"NVRTC compile exceeded "
                                            f"{self.timeout_s:g} s", compile_ms=(now - c.sent) * 1e3,
                                            compiler=compiler_version()))
                self._drop(c)

    def _answer(self, c: _Compiler) -> None:
        """Read what a compile process said: ready, a result, a bug, or nothing because it died."""
        try:
            tag, payload = c.conn.recv()
        except (EOFError, OSError):
            c.proc.join(timeout=2.0)  # reap it, so the exit code (or signal) is known
            code = c.proc.exitcode
            self._drop(c)
            if c.job is None:
                raise RuntimeError(f"a compile process died while starting (exit code {code})") from None
            # NVRTC took its process down: the source's fault, like any other compile failure
            self._finish(c, BuildResult(c.key, Status.COMPILE_ERROR, error=f"the compiler process died (exit code "
                                        f"{code})", compile_ms=(time.monotonic() - c.sent) * 1e3,
                                        compiler=compiler_version()))
            return
        if tag == "bug":
            self._drop(c)
            raise RuntimeError(f"a compile process failed (a bug, not the candidate):\n{payload}")
        if tag == "ready":
            c.ready = True
        else:
            self._finish(c, payload)

    def _finish(self, c: _Compiler, r: BuildResult) -> None:
        self._cache[c.key] = r
        c.key, c.job = "", None

    def _drop(self, c: _Compiler) -> None:
        c.kill()
        self._procs.remove(c)

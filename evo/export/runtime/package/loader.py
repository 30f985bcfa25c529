"""Kernel modules through cuda.core: the prebuilt cubin when the GPU's arch is the export's, else the
template rendered for this GPU and shape and compiled with NVRTC, cached in memory and on disk.

NVRTC compiles to a cubin for the GPU's own arch (no PTX JIT by the driver), with the CUDA headers
found by cuda.pathfinder (pip wheels) or under $CUDA_HOME, and the options the factory builds with.

A kernel with a compile-time cluster (`__cluster_dims__(x, y, z)`, as the cluster templates write it)
launches as an ordinary kernel; the driver groups its CTAs, which needs every grid dim to be a multiple
of the cluster's. `check_grid` holds each launch of a plan to that before it reaches the driver.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .choice import Choice
from .expr import DATA
from .table import Launch, OpTable

PACKAGE = __name__.split(".")[0]
NVRTC_STD = "c++17"
# Arch-specific feature sets ('a' suffix): a template may use wgmma, setmaxnreg or clusters there.
_ARCH_SPECIFIC = (90, 100, 101, 103, 110, 120, 121)


class CompileError(RuntimeError):
    """NVRTC could not build a kernel (no headers, no NVRTC, or an error in the source)."""


class PlanError(RuntimeError):
    """A launch the kernel cannot take (a grid that is not a multiple of its compile-time cluster)."""


# a kernel's declaration: its attributes (__cluster_dims__(...), __launch_bounds__(...)) and name
_KERNEL = re.compile(r"__global__\s+void\s+(?P<attrs>(?:__\w+__\s*(?:\([^)]*\))?\s*)*)(?P<name>\w+)\s*\(")
_CLUSTER = re.compile(r"__cluster_dims__\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)")


def cluster_dims(source: str) -> dict[str, tuple[int, int, int]]:
    """The compile-time cluster of each kernel of `source` that declares one, by kernel name."""
    out = {}
    for m in _KERNEL.finditer(source):
        c = _CLUSTER.search(m.group("attrs"))
        if c:
            out[m.group("name")] = tuple(int(v) if v else 1 for v in c.groups())
    return out


def check_grid(launch: Launch, clusters: Mapping[str, tuple[int, int, int]]) -> None:
    """PlanError unless every grid dim of `launch` is a multiple of its kernel's cluster dim."""
    cl = clusters.get(launch.kernel)
    if cl and any(g % c for g, c in zip(launch.grid, cl)):
        raise PlanError(f"{launch.kernel}: grid {launch.grid} is not a multiple of its cluster {cl}")


def arch_flag(arch: int, export_arch: str) -> str:
    """The NVRTC target for a GPU of this arch: 'sm_90a' style where the export used an 'a' target."""
    return f"sm_{arch}a" if export_arch.endswith("a") and arch in _ARCH_SPECIFIC else f"sm_{arch}"


def cache_dir() -> Path:
    """Compiled cubins: $<PACKAGE>_CACHE_DIR, else ~/.cache/<package>."""
    env = os.environ.get(f"{PACKAGE.upper()}_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / PACKAGE


@lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """CUDA headers for NVRTC (it finds none by itself)."""
    try:
        import cuda.pathfinder

        found = cuda.pathfinder.find_nvidia_header_directory("cudart")
    except (ImportError, RuntimeError):
        found = None
    if found:
        return (found,)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "include" / "cuda_fp16.h").exists():
        return (str(Path(home) / "include"),)
    raise CompileError("no CUDA headers for NVRTC: pip install 'cuda-toolkit[nvrtc,cudart,cccl]' or set CUDA_HOME")


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"nvrtcVersion failed: {err}")
    return f"nvrtc-{major}.{minor}"


def compile_cubin(source: str, arch: str) -> bytes:
    """NVRTC: CUDA C++ to a cubin for `arch` (no GPU needed)."""
    from cuda.core import Program, ProgramOptions
    from cuda.core._utils.cuda_utils import NVRTCError

    # the factory's options, ptxas -v included (it changes the cubin's bytes): same source, same cubin
    opts = ProgramOptions(arch=arch, std=NVRTC_STD, include_path=list(include_dirs()), ptxas_options=["-v"])
    try:
        return bytes(Program(source, code_type="c++", options=opts).compile("cubin").code)
    except NVRTCError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError(f"NVRTC failed for {arch}: {first}") from e


def source_for(table: OpTable, c: Choice) -> str:
    """The CUDA source of a choice: the shipped file for a prebuilt kernel, else rendered here."""
    if c.build:
        return (DATA / table.builds[c.build].cu).read_text()
    t = table.templates[c.template]
    return t.render(dict(c.params), c.arch, dict(c.dtypes), dict(c.consts))


def cubin_for(table: OpTable, c: Choice) -> bytes:
    """The prebuilt cubin, or one compiled now (or earlier, from the disk cache) for this choice."""
    if c.build:
        return (DATA / table.builds[c.build].cubin).read_bytes()
    source = source_for(table, c)
    flag = arch_flag(c.arch, table.arch)
    key = hashlib.sha256(f"{source}\0{flag}\0{nvrtc_version()}\0{NVRTC_STD}".encode()).hexdigest()
    path = cache_dir() / f"{key}.cubin"
    if path.exists():
        return path.read_bytes()
    cubin = compile_cubin(source, flag)
    try:  # atomically: another process may compile the same kernel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the in-memory cache still holds it for this process
    return cubin


@dataclass(frozen=True)
class Loaded:
    """A loaded module and the compile-time clusters of its kernels."""

    module: Any
    clusters: Mapping[str, tuple[int, int, int]]


class Modules:
    """Loaded kernel modules by choice (one per process, shared by threads)."""

    def __init__(self) -> None:
        self._mods: dict[tuple, Loaded] = {}
        self._lock = threading.Lock()

    def get(self, table: OpTable, c: Choice) -> Loaded:
        key = (c.op, c.template, c.params, c.dtypes, c.consts, c.arch, c.build)
        with self._lock:
            loaded = self._mods.get(key)
            if loaded is None:
                from cuda.core import ObjectCode

                loaded = Loaded(ObjectCode.from_cubin(cubin_for(table, c)), cluster_dims(source_for(table, c)))
                self._mods[key] = loaded
            return loaded

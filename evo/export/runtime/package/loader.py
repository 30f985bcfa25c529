"""Kernel modules through cuda.core: the prebuilt cubin when the GPU's arch is the export's, else the
template rendered for this GPU and shape and compiled with NVRTC, cached in memory and on disk.

NVRTC compiles to a cubin for the GPU's own arch (no PTX JIT by the driver), with the CUDA headers
found by cuda.pathfinder (pip wheels) or under $CUDA_HOME, and the options the factory builds with.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from .choose import Choice
from .expr import DATA
from .table import OpTable

PACKAGE = __name__.split(".")[0]
NVRTC_STD = "c++17"
# Arch-specific feature sets ('a' suffix): a template may use wgmma, setmaxnreg or clusters there.
_ARCH_SPECIFIC = (90, 100, 101, 103, 110, 120, 121)


class CompileError(RuntimeError):
    """NVRTC could not build a kernel (no headers, no NVRTC, or an error in the source)."""


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


class Modules:
    """Loaded kernel modules by choice (one per process, shared by threads)."""

    def __init__(self) -> None:
        self._mods: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, table: OpTable, c: Choice) -> Any:
        key = (c.op, c.template, c.params, c.dtypes, c.consts, c.arch, c.build)
        with self._lock:
            mod = self._mods.get(key)
            if mod is None:
                from cuda.core import ObjectCode

                mod = ObjectCode.from_cubin(cubin_for(table, c))
                self._mods[key] = mod
            return mod

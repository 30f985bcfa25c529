"""Another NVRTC than the installed one, for rebuilding a run's cubins with the NVRTC that built them.

NVRTC's output changes with its version, so checking that today's sources give the cubins a run
measured needs that run's NVRTC. A folder holding libnvrtc.so.MAJOR and libnvrtc-builtins.so.MAJOR.MINOR
(`pip install --no-deps --target DIR nvidia-cuda-nvrtc==13.0.88`, or a CUDA toolkit's lib64) is
loaded into a fresh compile process before cuda.bindings looks for NVRTC: cuda.pathfinder takes a
library that is already loaded, and libnvrtc finds its builtins by the soname loaded first.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

# where the library lies under a pip --target folder, a wheel's site-packages or a toolkit root
_LAYOUTS = (".", "lib", "lib64", "nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib")
_BUILTINS = re.compile(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)")


class NvrtcLibError(ValueError):
    """A folder that holds no usable NVRTC."""


@dataclass(frozen=True)
class NvrtcLib:
    """An NVRTC on disk: its two libraries and the version they are ('nvrtc-13.0', as compiler_version)."""

    version: str
    nvrtc: Path
    builtins: Path


def find_nvrtc(root: Path) -> NvrtcLib:
    """The NVRTC under `root` (one of the usual layouts); NvrtcLibError when there is none."""
    for rel in _LAYOUTS:
        d = root / rel
        builtins = sorted(p for p in d.glob("libnvrtc-builtins.so.*") if _BUILTINS.fullmatch(p.name))
        if not builtins:
            continue
        major, minor = _BUILTINS.fullmatch(builtins[0].name).groups()  # type: ignore[union-attr]
        nvrtc = d / f"libnvrtc.so.{major}"
        if nvrtc.exists():
            return NvrtcLib(f"nvrtc-{major}.{minor}", nvrtc, builtins[0])
    raise NvrtcLibError(f"no NVRTC under {root} (looked for libnvrtc.so.N and libnvrtc-builtins.so.N.M in "
                        f"{', '.join(_LAYOUTS)})")


def load_nvrtc(lib: NvrtcLib) -> None:
    """Load `lib` into this process, before anything else loads NVRTC (a fresh compile process)."""
    ctypes.CDLL(str(lib.builtins), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib.nvrtc), mode=ctypes.RTLD_GLOBAL)

"""What a benchmark file says about where it ran: the card (name, SMs, clocks, memory), the driver, CUDA, NVRTC,
torch and triton, Python, each peer's version, and the copy ceiling measured in the same process."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable
from importlib import metadata
from typing import Any

_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
               "power.limit", "temperature.gpu", "persistence_mode", "memory.total")


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def smi(fields: tuple[str, ...] = _SMI_FIELDS) -> dict[str, str]:
    """nvidia-smi's view of GPU 0 (clocks at the time asked, limits, driver); a field this nvidia-smi does not know
    is left out, {} where it cannot be asked."""
    def ask(names: tuple[str, ...]) -> list[str] | None:
        try:
            out = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(names)}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        values = [v.strip() for v in out.stdout.strip().split(",")]
        return values if out.returncode == 0 and len(values) == len(names) else None

    together = ask(fields)
    if together is not None:
        return dict(zip(fields, together))
    return {f: v[0] for f in fields if (v := ask((f,))) is not None}


def nvrtc_version() -> str | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}" if int(err) == 0 else None


def card() -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sm": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            "smi": smi()}


# the environment variables that change how a side is built, tuned or timed (QuACK's autotuning and its cache, the
# Triton cache, the L2 flush), recorded with the results where set
PEER_SETTINGS = ("QUACK_CACHE_AUTOTUNING", "QUACK_HOME", "QUACK_CACHE_DIR", "TRITON_CACHE_DIR", "KF_L2_FLUSH")


def environment(peer_dists: Iterable[str]) -> dict[str, Any]:
    import torch

    return {"card": card(), "driver_cuda": _driver(), "cuda_runtime": torch.version.cuda, "nvrtc": nvrtc_version(),
            "torch": torch.__version__, "triton": version("triton"), "python": platform.python_version(),
            "peers": {d: version(d) for d in peer_dists},
            "settings": {k: os.environ[k] for k in PEER_SETTINGS if k in os.environ}}


def _driver() -> str | None:
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    err, v = driver.cuDriverGetVersion()
    return f"{v // 1000}.{v % 1000 // 10}" if int(err) == 0 else None


def copy_ceiling_gbps(nbytes: int = 1 << 30, samples: int = 30) -> dict[str, Any]:
    """A device-to-device copy of nbytes timed by the benchmarks' timer (kernel time): bytes read + written per
    second, the ceiling a memory-bound kernel is measured against."""
    import torch

    med, ok = _copy_us(nbytes, samples)
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "median_us": med, "gbps": 2 * nbytes / med / 1e3, "copy_correct": ok}


def _copy_us(nbytes: int, samples: int) -> tuple[float, bool]:
    import statistics

    import torch

    from .timing import kernel_and_call_us

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    kernel, _, _ = kernel_and_call_us([lambda: dst.copy_(src)], samples, warmup=3)
    return statistics.median(kernel[0]), bool(torch.equal(dst, src))

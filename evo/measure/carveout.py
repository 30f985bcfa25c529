"""The shared-memory carveout the worker asks the driver for ($KF_SMEM_CARVEOUT; evo/measure/worker.py sets it).

An SM splits its 256 KB of L1 and shared memory by a carveout chosen per kernel; CTAs of two kernels share an SM only
under one split, and an SM changes its split only once empty. Unset (the default), the driver picks each kernel's
split. A percentage 0..100 asks for that share of the maximum as shared memory for every kernel the worker
launches (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT): the probe of plans whose launches run beside each
other (tests/gpu/test_kda_launch_times.py -k schedules). The value is in the worker's fingerprint when set.
"""

from __future__ import annotations

import os


def smem_carveout() -> int | None:
    """The percentage $KF_SMEM_CARVEOUT names, or None when unset or empty; anything else is refused by name."""
    raw = os.environ.get("KF_SMEM_CARVEOUT", "").strip()
    if not raw:
        return None
    try:
        pct = int(raw)
    except ValueError:
        pct = -1
    if not 0 <= pct <= 100:
        raise ValueError(f"KF_SMEM_CARVEOUT={raw!r}: expected a percentage, an integer 0..100, or unset")
    return pct

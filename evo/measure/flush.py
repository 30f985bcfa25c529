"""How the L2 is flushed before each timed sample ($KF_L2_FLUSH; the worker, evo/measure/worker.py, does it).

"read" (the default): a kernel reads 256 MiB, leaving only clean lines, so the timed span holds
the call's own traffic. "write": a 256 MiB memset (the earlier default), which leaves an L2 of
dirty lines whose write-back falls inside the timed call. On the H200 that tax was ~3.5 us: a copy of 2 x 134 MB
took 66.9 us after the memset and 63.4 us after the reads (in a KDA decode run), large against
a kernel moving a few hundred MB and nothing against the 2 GiB copy ceiling. Measurements of the two modes are not
compared: the mode is in the worker's fingerprint and, when not "write", in its class (evo/loop/record.py).
"""

from __future__ import annotations

import os

L2_FLUSHES = ("read", "write")
DEFAULT_L2_FLUSH = "read"
FLUSH_HOW = {"read": "reading 256 MiB: clean lines only", "write": "a 256 MiB memset: dirty lines left"}


def l2_flush_mode() -> str:
    """The flush $KF_L2_FLUSH names (default read); anything else is refused by name."""
    mode = os.environ.get("KF_L2_FLUSH", DEFAULT_L2_FLUSH)
    if mode not in L2_FLUSHES:
        raise ValueError(f"KF_L2_FLUSH={mode!r}: expected one of {', '.join(L2_FLUSHES)}")
    return mode

"""The first-use check's rules, torch-free. Every kernel, the table's included (the factory's gate ran it on the
shapes it drew, not on the caller's), is checked against a float64 reference the first time it runs in each shape
class, unless the environment's `<PACKAGE>_SELFCHECK` is "0":

- A shape class is the kernel and the small shape that stands for the call's (`probe_dims`, the family's rule,
  built from `reduced`): each run-time extent a kernel tiles as itself up to PROBE_TILE, past it PROBE_TILE plus
  its residue modulo PROBE_TILE, so every tile of 64 or a divisor of 64 ends the class's probe as it ends the call.
- The probe: the kernel launched at that shape on fresh random inputs (drawn from the OS's entropy, so no two
  processes probe the same data) and every output compared with the reference. A kernel that fails it is not
  used again in the process; its calls take the torch path.
- A call whose class has no probe shape (the template refuses the small shape) is checked on its own data.
- Inside CUDA graph capture nothing can be read back: an unchecked class takes the torch path there (run the
  call once before capturing it).
"""

from __future__ import annotations

import enum
import os

PROBE_TILE = 64


def reduced(extent: int) -> int:
    """A run-time extent's class representative: itself up to PROBE_TILE, else PROBE_TILE plus its residue."""
    return extent if extent <= PROBE_TILE else PROBE_TILE + extent % PROBE_TILE


def selfcheck_on(package: str) -> bool:
    """False when the user turned the first-use check off (`<PACKAGE>_SELFCHECK=0`)."""
    return os.environ.get(f"{package.upper()}_SELFCHECK", "1") != "0"


class Step(enum.Enum):
    RUN = "run"  # launch and trust: the class was checked, or the user opted out
    PROBE = "probe"  # check the class's probe first, then launch
    CHECK_CALL = "check the call"  # launch, then check the call's own outputs
    TORCH = "torch"  # not now: the torch path (graph capture before the class was checked)


def first_use(selfcheck: bool, checked: bool, capturing: bool, probe: bool) -> Step:
    """What a kernel's call does before its outputs are trusted: `checked` its class already, `capturing` a CUDA
    graph, `probe` a probe shape for its class."""
    if not selfcheck or checked:
        return Step.RUN
    if capturing:
        return Step.TORCH
    return Step.PROBE if probe else Step.CHECK_CALL

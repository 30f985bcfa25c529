"""A cubin's SASS without a GPU: one kernel's instructions in order, from nvdisasm (the CUDA toolkit's binary,
`pip install 'cuda-toolkit[nvdisasm]'`, found by cuda.pathfinder), and its innermost loops (the bodies of backward
branches that hold no other loop) with their instructions counted by opcode. What a template change does to a hot
loop can be read here before any GPU times it."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:\S+,\s*)?`\((\.L_x_\d+)\)")


class SassError(RuntimeError):
    """No nvdisasm, or it failed, or the cubin has no such kernel."""


def nvdisasm_path() -> str:
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError as e:  # cuda-pathfinder before its binary utilities
        raise SassError(f"cuda.pathfinder cannot find binaries ({e}): upgrade cuda-pathfinder") from e
    path = find_nvidia_binary_utility("nvdisasm")
    if not path:
        raise SassError("no nvdisasm: pip install 'cuda-toolkit[nvdisasm]'")
    return path


def _kernel_text(cubin: bytes, kernel: str, *flags: str) -> list[str]:
    """nvdisasm's lines of `kernel`'s section (after its `.text.` head, up to the next function's)."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        r = subprocess.run([nvdisasm_path(), "-c", *flags, str(f)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SassError(f"nvdisasm failed: {r.stderr.strip()[:300]}")
    head = f".text.{kernel}:"
    if head not in r.stdout:
        raise SassError(f"no kernel {kernel!r} in the cubin")
    out = []
    for line in r.stdout.split(head, 1)[1].splitlines():
        if line.lstrip().startswith(".section") and ".text." in line:
            break  # the next function
        out.append(line)
    return out


def disassemble(cubin: bytes, kernel: str) -> list[str]:
    """`kernel`'s instructions (predicate, opcode and operands, no address) and its labels (`.L_x_N:`), in order."""
    out: list[str] = []
    for line in _kernel_text(cubin, kernel):
        m = _INSTR.match(line)
        if m:
            out.append(m.group(2))
        elif _LABEL.match(line):
            out.append(_LABEL.match(line).group(1) + ":")
    return out


@dataclass(frozen=True)
class Control:
    """The scheduling bits ptxas puts in the top 23 of an sm_70+ instruction's 128 (sm_90 included): `stall`, the
    cycles the warp waits before issuing its next instruction (fixed-latency results are covered by these); `yield_`;
    the scoreboard (0-5) the instruction releases when its variable-latency result is written (`write`) or its
    operands have been read (`read`), None for none; `wait`, the scoreboards (a 6-bit mask) that must be released
    before it issues; `reuse`, its operand-reuse flags."""

    stall: int
    yield_: bool
    write: int | None
    read: int | None
    wait: int
    reuse: int


def decode_control(high: int) -> Control:
    """The control bits of the instruction whose upper 64-bit word (nvdisasm -hex's second word) is `high`."""
    c = high >> 41
    wb, rb = (c >> 5) & 7, (c >> 8) & 7
    return Control(stall=c & 0xF, yield_=bool((c >> 4) & 1), write=None if wb == 7 else wb,
                   read=None if rb == 7 else rb, wait=(c >> 11) & 0x3F, reuse=(c >> 17) & 0xF)


_HEX = re.compile(r"/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")


def scheduled(cubin: bytes, kernel: str) -> list[tuple[str, Control | None]]:
    """disassemble's list (the same entries, the same indices: inner_loops' spans fit it) with each instruction's
    control bits; labels carry None."""
    out: list[tuple[str, Control | None]] = []
    pending = None
    for line in _kernel_text(cubin, kernel, "-hex"):
        m = _INSTR.match(line)
        if m:
            pending = m.group(2)
            continue
        if _LABEL.match(line):
            out.append((_LABEL.match(line).group(1) + ":", None))
            continue
        h = _HEX.search(line)
        if h and pending is not None and not line.lstrip().startswith("/*0"):
            out.append((pending, decode_control(int(h.group(1), 16))))
            pending = None
    if pending is not None:
        raise SassError(f"no control word after {pending!r}")
    return out


def opcode(instr: str) -> str:
    """The opcode's base name: `@!P0 FMUL.FTZ R1, ...` -> FMUL."""
    words = instr.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


@dataclass(frozen=True)
class Loop:
    """An innermost loop: `first` and `last` index the body (labels included) in disassemble's list; `ops` counts
    its instructions by opcode."""

    first: int
    last: int
    ops: tuple[tuple[str, int], ...]

    @property
    def size(self) -> int:
        return sum(n for _, n in self.ops)

    def count(self, op: str) -> int:
        return dict(self.ops).get(op, 0)


def inner_loops(lines: list[str]) -> list[Loop]:
    """The bodies of backward branches (label .. branch) that contain no other such body, in code order; a branch
    to itself (nvdisasm's padding after the last EXIT) is no loop."""
    at = {ln[:-1]: i for i, ln in enumerate(lines) if ln.endswith(":")}
    spans = []
    for i, ln in enumerate(lines):
        if ln.endswith(":"):
            continue
        m = _BRANCH.search(ln)
        if m and at.get(m.group(1), i + 1) < i and any(not x.endswith(":") for x in lines[at[m.group(1)]:i]):
            spans.append((at[m.group(1)], i))  # (not the branch to itself that pads a function after its EXIT)
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    out = []
    for a, b in sorted(set(inner)):
        ops = Counter(opcode(x) for x in lines[a:b + 1] if not x.endswith(":"))
        out.append(Loop(a, b, tuple(sorted(ops.items()))))
    return out

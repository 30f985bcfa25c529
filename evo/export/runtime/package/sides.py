"""One cell of a package benchmark: the package's call and every peer ("sides") on the same inputs, each side's
output checked against the float64 reference before it is timed, then all correct sides timed together
(timing.kernel_and_call_us: interleaved sample by sample, the L2 flushed before each sample).

A side is a callable, or a one-line reason why it is absent (not installed, no such variant). A side whose output
is wrong is reported wrong with the checker's words and not timed; one that raises is reported failed with the
exception's first line. Nothing is replaced by something else."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping
from typing import Any

PACKAGE_SIDE = "package"
Side = Callable[[], Any] | str


def side(make: Callable[[], Callable[[], Any]]) -> Side:
    """make(): a peer's callable; or why it is absent: not installed (ImportError), no such variant
    (NotImplementedError, its words), or it could not load (a missing shared library, a driver it does not support)."""
    try:
        return make()
    except ImportError as e:
        return f"not installed: {e}"
    except NotImplementedError as e:
        return str(e)
    except Exception as e:
        return f"could not load: {first_line(e)}"


def spread(v: list[float]) -> list[float]:
    """The 10th and 90th percentiles."""
    if len(v) < 2:
        return [v[0], v[0]] if v else []
    q = statistics.quantiles(v, n=10)
    return [q[0], q[-1]]


def first_line(e: BaseException) -> str:
    """The exception's type and first line, without terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def check_sides(sides: Mapping[str, Side], check: Callable[[str, Any], str]) -> dict[str, dict[str, Any]]:
    """Each side's status before timing: absent (with its reason), failed (it raised), wrong (check's words) or ok.
    `check(name, output)` returns '' for a correct output."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name, side in sides.items():
        if isinstance(side, str):
            out[name] = {"status": "absent", "reason": side}
            continue
        try:
            result = side()
            torch.cuda.synchronize()
            problem = check(name, result)
        except Exception as e:  # a peer's own failure on this cell is a result, not a crash of the bench
            out[name] = {"status": "failed", "reason": first_line(e)}
            continue
        out[name] = {"status": "wrong", "reason": problem} if problem else {"status": "ok"}
    return out


def compare(sides: Mapping[str, Side], check: Callable[[str, Any], str], nbytes: int, samples: int,
            ceiling_gbps: float | None) -> dict[str, Any]:
    """The cell's sides (status, kernel, call and host medians with their 10-90% spread, GB/s, % of the copy
    ceiling), and the package's speedup over the fastest correct peer by kernel time and by call time. Host time: what
    issuing one call costs the host (timing.kernel_and_call_us), the serving path's measure beside torch eager's."""
    from .timing import kernel_and_call_us

    status = check_sides(sides, check)
    ok = [n for n, s in status.items() if s["status"] == "ok"]
    if ok:
        kernel, call, host = kernel_and_call_us([sides[n] for n in ok], samples)  # type: ignore[misc]
        for n, k, c, h in zip(ok, kernel, call, host):
            med = statistics.median(k)
            status[n] |= {"kernel_us": med, "kernel_p10_p90_us": spread(k), "call_us": statistics.median(c),
                          "call_p10_p90_us": spread(c), "host_us": statistics.median(h), "host_p10_p90_us": spread(h),
                          "samples": len(k), "gbps": nbytes / med / 1e3,
                          "pct_ceiling": 100 * nbytes / med / 1e3 / ceiling_gbps if ceiling_gbps else None}
    return {"bytes": nbytes, "sides": status, **verdict(status)}


def verdict(status: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The fastest correct peer by kernel time and by call time, and the package's speedups over each (None where
    the package or every peer was not timed). Sides named "package.<path>" (another path of the package's own, timed
    as a diagnostic) are no peers."""
    mine = status.get(PACKAGE_SIDE, {})
    peers = {n: s for n, s in status.items()
             if n != PACKAGE_SIDE and not n.startswith(PACKAGE_SIDE + ".") and s.get("status") == "ok"}
    out: dict[str, Any] = {"correct": mine.get("status") == "ok"}
    for col in ("kernel", "call"):
        best = min(peers, key=lambda n: peers[n][f"{col}_us"]) if peers else None
        out[f"best_peer_{col}"] = best
        out[f"speedup_{col}"] = (peers[best][f"{col}_us"] / mine[f"{col}_us"]
                                 if best and f"{col}_us" in mine else None)
    return out


def summary_line(r: dict[str, Any]) -> str:
    """A cell's sides in one line: kernel/call medians of the timed ones, the status of the others."""
    return "; ".join(f"{n} {s['kernel_us']:.1f}/{s['call_us']:.1f} us" if s["status"] == "ok" else f"{n} {s['status']}"
                     for n, s in r["sides"].items())

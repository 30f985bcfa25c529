"""Device-to-device copy bandwidth at the sizes of the KDA decode cells' state traffic and at the 2 GiB of the
gate's copy ceiling (which the gate measures with cuMemcpyDtoDAsync), with one timer, in one process: what share of the 2 GiB ceiling a copy of a decode cell's
bytes reaches (the decode target is >= 90% of the ceiling at B >= 64).

Each size: two buffers of `n` bytes (the cell's fp32 state read and written: n = N HV K V 4), the source filled
with ones (never zeros), torch's copy_ (a device-to-device copy) timed by CUDA events, the L2 flushed before every
sample, median of REPS after WARMUP. Bandwidth = 2 n / time (bytes read + written, as the ceiling counts them).
The flush (--flush, one or both, default both, each timed over every size): `read`, a reduction reading 256 MiB
(clean lines only: the gate's default, evo/measure/worker.py KF_L2_FLUSH), or `write`, a 256 MiB fill (the
gate's flush before 2026-12-04; it leaves dirty lines whose write-back falls in the timed copy).

    python experiments/scripts/copy_sizes.py OUT.json [--flush read write]

Needs a CUDA device and torch (the GPU machine's image).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPS = 30
WARMUP = 5
FLUSH_BYTES = 256 << 20
# decode cells (B, H = HV = 32, K = V = 128, fp32 state): their state bytes one way
DECODE_B = (1, 16, 64, 256)
CEILING_BYTES = 2 << 30


def state_bytes(b: int, hv: int = 32, k: int = 128, v: int = 128) -> int:
    """A decode cell's fp32 state, read once and written once: the bytes of one way."""
    return b * hv * k * v * 4


def gpu_fingerprint() -> dict[str, str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"nvidia_smi": f"absent: {e}"}
    keys = ("gpu", "sm_clock", "sm_clock_max", "mem_clock", "driver")
    return dict(zip(keys, (x.strip() for x in out.split(","))))


FLUSHES = ("read", "write")


def measure(n: int, torch, flush_mode: str = "read") -> float:
    """Median microseconds of one n-byte device copy, L2 flushed (by writes or reads) before each sample."""
    if flush_mode not in FLUSHES:
        raise ValueError(f"flush {flush_mode!r}: expected one of {', '.join(FLUSHES)}")
    a = torch.ones(n // 4, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    flush = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    times = []
    for i in range(WARMUP + REPS):
        if flush_mode == "write":
            flush.fill_(float(i + 1))
        else:
            flush.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end) * 1e3)
    if not bool(torch.equal(a[:1024], b[:1024])) or not bool(torch.equal(a[-1024:], b[-1024:])):
        raise RuntimeError(f"the {n}-byte copy did not copy")
    del a, b, flush
    torch.cuda.empty_cache()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--flush", nargs="+", choices=FLUSHES, default=list(FLUSHES),
                   help="how the L2 is flushed before each sample (each mode timed over every size)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("copy_sizes: no CUDA device", file=sys.stderr)
        return 2
    sizes = {f"decode_B{b}": state_bytes(b) for b in DECODE_B} | {"ceiling_2GiB": CEILING_BYTES}
    rows = []
    for mode in args.flush:
        part = []
        for name, n in sizes.items():
            us = measure(n, torch, mode)
            part.append({"name": name, "flush": mode, "bytes_one_way": n, "median_us": us,
                         "gbps": 2 * n / (us * 1e-6) / 1e9})
        ceiling = next(r["gbps"] for r in part if r["name"] == "ceiling_2GiB")
        for r in part:
            r["share_of_2GiB_ceiling"] = r["gbps"] / ceiling  # against the same flush's 2 GiB copy
            print(f"{r['name']} ({mode} flush): {r['bytes_one_way'] / 1e6:.1f} MB one way, {r['median_us']:.1f} us, "
                  f"{r['gbps']:.0f} GB/s = {r['share_of_2GiB_ceiling']:.1%} of the 2 GiB copy")
        rows += part
    out = {"fingerprint": gpu_fingerprint() | {"torch": torch.__version__, "cuda": str(torch.version.cuda)},
           "method": "torch copy_ (a device copy), CUDA events, L2 flushed before each sample by a 256 MiB fill "
                     "(flush = write) or a sum over 256 MiB (flush = read), "
                     f"median of {REPS} after {WARMUP}; shares against the same flush's 2 GiB copy", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

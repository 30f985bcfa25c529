"""Does the gate's timing protocol itself slow an honest kernel? Same process, same inputs, interleaved.

Times the `cta_row` template at its default point (repaired per cell) on the gallery's honest-control
cells with the full gate, and with the two per-sample additions of gate v2 switched off (the random
poison of the outputs and workspaces before every timed sample, and the reset of persisting L2 lines;
the L2 flush stays). Both variants run in one worker process, alternating, `--reps` times each; the
file records every median and the ratio of the medians of medians. Rerun on a GPU machine:
python experiments/scripts/gate_overhead.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from evo import Gate

CELLS = ("w=bf16,x=bf16 M4096-N1024", "w=bf16,x=bf16 M4096-N2048", "w=bf16,x=bf16 M32768-N4096",
         "w=fp16,x=fp16 M32768-N32768", "w=fp32,x=fp32 M4096-N8192", "w=fp32,x=fp32 M32768-N16384")


class _FlushOnly:
    """The worker, with reset_l2 flushing the L2 without resetting persisting lines."""

    def __init__(self, worker: Any) -> None:
        self._w = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def reset_l2(self) -> None:
        self._w.flush_l2()  # the worker's flush (its KF_L2_FLUSH mode), no persisting-line reset


class BareTiming(Gate):
    """The gate with no poison before timed samples and no persisting-L2 reset (checks unchanged)."""

    def _round_b(self, g: Any, sets: list) -> Any:
        keep = self.dev
        self.dev = _FlushOnly(keep)
        try:
            return super()._round_b(g, sets)
        finally:
            self.dev = keep

    def _time_direct(self, *a: Any) -> Any:
        return self._without_poison(super()._time_direct, *a)

    def _time_graph(self, *a: Any) -> Any:
        return self._without_poison(super()._time_graph, *a)

    def _without_poison(self, fn: Any, *a: Any) -> Any:
        keep = self._poison
        self._poison = lambda s: None
        try:
            return fn(*a)
        finally:
            self._poison = keep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gate_overhead_h200.json")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from evo import Builder, default_for_cell, fresh_rng, get_op, hand_job, load_templates, Worker

    op = get_op("rmsnorm")
    tdef = load_templates("rmsnorm")["cta_row"]
    cells = [c for c in op.matrix() if c.label() in CELLS]
    w = Worker()
    rows = []
    t0 = time.time()
    with Builder(workers=2) as builder:
        for c in cells:
            params = default_for_cell(tdef, 90, c)
            hj = hand_job(builder, op, tdef, params, c, seed=7, baseline=True, gate_cells=False)
            got: dict[str, list[float]] = {"gate": [], "bare": []}
            base: dict[str, list[float]] = {"gate": [], "bare": []}
            graph = None
            for rep in range(args.reps):
                for name, cls in (("gate", Gate), ("bare", BareTiming)) if rep % 2 == 0 else (
                        ("bare", BareTiming), ("gate", Gate)):
                    res = hj.gate(cls, w, fresh_rng()).run()
                    v = hj.judge(res)
                    if v.status.value != "OK":
                        raise RuntimeError(f"{name} on {c.label()}: {v.status.value} {v.error}")
                    got[name].append(v.median_us)
                    base[name].append(v.baseline_us)
                    graph = res.graph
            med = {k: float(np.median(v)) for k, v in got.items()}
            rows.append({"cell": c.label(), "params": params, "graph": graph, "median_us": got,
                         "baseline_us": base, "ratio_gate_to_bare": med["gate"] / med["bare"],
                         "baseline_ratio_gate_to_bare": float(np.median(base["gate"]) / np.median(base["bare"]))})
            print(f"{c.label():<28} graph={graph!s:<5} gate {med['gate']:9.2f} us  bare {med['bare']:9.2f} us  "
                  f"x{rows[-1]['ratio_gate_to_bare']:.3f}  (torch x{rows[-1]['baseline_ratio_gate_to_bare']:.3f})",
                  flush=True)
    doc = {"fingerprint": dict(w.fingerprint), "ceiling_gbps": w.ceiling_gbps, "reps": args.reps,
           "wall_s": round(time.time() - t0, 1), "cells": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the gate's newest rounds cost an evaluation: the wall time of one gate job, the whole gate against the same gate
without what versions 9 and 10 added (the pair of launches on two streams, the launch beside a kernel holding most
SMs, the causal check; in graph mode the replay that refreshes each set before its launch), in one worker process,
alternating, each repetition a fresh job (shapes, scalars and inputs drawn from the OS). The cases are a matrix cell's
default point of RMSNorm's cta_row (three sizes), KDA's recurrent decode and KDA's chunk prefill. Rerun on a GPU
machine: python experiments/scripts/gate_cost.py --out build/gate_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from evo import Gate

ROOT = Path(__file__).resolve().parents[2]
# (op, template, the label of the matrix cell it runs on)
CASES = (("rmsnorm", "cta_row", "w=bf16,x=bf16 M4096-N2048"), ("rmsnorm", "cta_row", "w=bf16,x=bf16 M32768-N4096"),
         ("rmsnorm", "cta_row", "w=fp16,x=fp16 M32768-N32768"),
         ("kda", "recurrent", "g=fp32,state=fp32,x=bf16 B64-H32-HV32-K128-N64-Ncu65-SC128-SR128-T1-V128-beta_act0-gate0-"
                              "qk_l2norm0-v_first0"),
         ("kda", "chunk", "g=fp32,state=fp32,x=bf16 B1-H32-HV32-K128-N1-Ncu2-SC128-SR128-T8192-V128-beta_act0-gate0-"
                          "qk_l2norm0-v_first0"))


class Gate8(Gate):
    """The gate without versions 9's and 10's rounds: no pair on two streams, no crowded launch, no causal check, no
    refreshed replay (every other check and the timing unchanged)."""

    def _round_shared(self, g: Any, sets: list) -> None:
        return None

    def _pair(self, g: Any, a: Any, b: Any) -> None:
        return None

    def _causality(self, g: Any, a: Any, b: Any) -> None:
        return None

    def _refreshed_replay(self, g: Any, sets: list) -> None:
        return None


def timed(run: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    res = run()
    return time.perf_counter() - t0, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gate_cost.json")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from evo import Builder, default_for_cell, fresh_rng, get_op, hand_job, load_templates, Worker

    w = Worker()
    version = dict(w.fingerprint)["gate"]
    rows = []
    t0 = time.time()
    with Builder(workers=2) as builder:
        for op_name, template, label in CASES:
            op, tdef = get_op(op_name), load_templates(op_name)[template]
            cell = next(c for c in op.all_cells() if c.label() == label)
            params = default_for_cell(tdef, 90, cell)
            wall: dict[str, list[float]] = {"gate": [], "gate 8 rounds": []}
            for rep in range(args.reps):
                order = (("gate", Gate), ("gate 8 rounds", Gate8))
                for name, cls in order if rep % 2 == 0 else order[::-1]:
                    hj = hand_job(builder, op, tdef, params, cell, seed=rep, baseline=False)
                    s, res = timed(lambda: hj.gate(cls, w, fresh_rng()).run())
                    v = hj.judge(res)
                    if v.status.value != "OK":
                        raise RuntimeError(f"{name} on {label}: {v.status.value} {v.error}")
                    wall[name].append(s)
            med = {k: float(np.median(v)) for k, v in wall.items()}
            rows.append({"op": op_name, "template": template, "cell": label, "params": params, "wall_s": wall,
                         "ratio_to_8": med["gate"] / med["gate 8 rounds"]})
            print(f"{op_name:<8} {template:<10} {label[:40]:<40} gate {version} {med['gate']:7.2f} s  without its "
                  f"newest rounds {med['gate 8 rounds']:7.2f} s  x{rows[-1]['ratio_to_8']:.3f}", flush=True)
    doc = {"fingerprint": dict(w.fingerprint), "gate": version, "reps": args.reps,
           "wall_s": round(time.time() - t0, 1), "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

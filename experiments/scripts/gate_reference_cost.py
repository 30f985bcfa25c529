"""What does checking the gate's float64 reference cost an evaluation? Gate 6 against gate 5.

Gate 5 recomputed the reference before every comparison (a kernel could overwrite a reused one with its own
answer); gate 6 computes it once per set and audits it instead (a keyed checksum taken by every comparison).
Evaluates one template's default point (repaired per cell) on cells of RMSNorm, its backward and KDA (prefill
and decode) with the real gate, and with `Recomputed`, gate 5's policy (defined here only: the gate itself has
no switch). Both run in one worker process, alternating, `--reps` times each, with the GA's job (every input
kind, its gate cells, its timing protocol, no peer beside it). The file records each evaluation's wall seconds,
how many reference computations it made, the candidate's median, and the ratio of the medians of the wall
times. (gate5_cost_h100.json, in git history, was this script's first form: gate 5 against gate 4's
unaudited reuse.) Rerun on a GPU machine: python experiments/scripts/gate_reference_cost.py [--out FILE] [--only REGEX]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from evo.measure.gate import Gate

# (op, template, cell label prefix): the first matrix cell whose label starts with the prefix
CASES = (
    ("rmsnorm", "cta_row", "w=bf16,x=bf16 M4096-N1024"),
    ("kda", "chunk", "g=fp32,state=fp32,x=bf16 B1-H32-HV32-K128-N1-Ncu2-SC128-SR128-T8192"),
    ("kda", "recurrent", "g=fp32,state=fp32,x=bf16 B64-"),
    ("rmsnorm_bwd", "rows_smem", "w=bf16,x=bf16 M32768-N8192"),
    ("rmsnorm", "cta_row", "w=bf16,x=bf16 M32768-N8192"),
    ("rmsnorm_bwd", "rows_smem", "w=fp32,x=fp32 M32768-N16384"),
    ("kda", "chunk", "g=fp32,state=fp32,x=bf16 B1-H16-HV16-K128-N1-Ncu2-SC128-SR128-T32768"),
)


class Counting(Gate):
    """The gate, counting the float64 reference computations it launches."""

    refs_computed = 0

    def _reference(self, g: Any, s: Any, fresh: bool = False) -> Any:
        if fresh or g.ref_of != (id(s), s.version):
            self.refs_computed += 1
        return super()._reference(g, s, fresh)


class Recomputed(Counting):
    """Gate 5's policy: the reference recomputed before every comparison, never reused."""

    def _reusable(self, g: Any, s: Any) -> bool:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gate_reference_cost.json")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="regular expression on 'op template cell'")
    args = ap.parse_args()
    from evo.build.nvrtc import Builder
    from evo.cli.bench import default_for_cell
    from evo.measure.worker import Worker
    from evo.templates.template import load_templates
    from evo.tools.hand_gate import cell_by_prefix, fresh_rng, hand_job
    from evo.core.registry import get_op

    w = Worker()
    rows = []
    t0 = time.time()
    with Builder(workers=2) as builder:
        for op_name, tname, prefix in CASES:
            if args.only and not re.search(args.only, f"{op_name} {tname} {prefix}"):
                continue
            op = get_op(op_name)
            tdef = load_templates(op_name)[tname]
            cell = cell_by_prefix(op, prefix)
            params = default_for_cell(tdef, 90, cell)
            if params is None:
                raise RuntimeError(f"{tname} has no legal point on {cell.label()}")
            hj = hand_job(builder, op, tdef, params, cell, seed=7)
            wall: dict[str, list[float]] = {"gate": [], "recomputed": []}
            refs: dict[str, list[int]] = {"gate": [], "recomputed": []}
            med: dict[str, list[float]] = {"gate": [], "recomputed": []}
            for rep in range(args.reps):
                order = (("gate", Counting), ("recomputed", Recomputed))
                for name, cls in order if rep % 2 == 0 else order[::-1]:
                    gate = hj.gate(cls, w, fresh_rng())
                    t = time.perf_counter()
                    res = gate.run()
                    w.sync("gate_reference_cost")
                    wall[name].append(time.perf_counter() - t)
                    v = hj.judge(res)
                    if v.status.value != "OK":
                        raise RuntimeError(f"{name} on {cell.label()}: {v.status.value} {v.error}")
                    refs[name].append(gate.refs_computed)
                    med[name].append(v.median_us)
            mw = {k: float(np.median(v)) for k, v in wall.items()}
            rows.append({"op": op_name, "template": tname, "cell": cell.label(), "params": params,
                         "gate_cells": len(hj.gate_cells), "wall_s": wall, "refs_computed": refs, "median_us": med,
                         "wall_ratio_gate_to_recomputed": mw["gate"] / mw["recomputed"]})
            print(f"{op_name:<12} {tname:<10} {cell.label()[:48]:<48} gate {mw['gate']:7.2f} s "
                  f"({refs['gate'][0]} refs)  recomputed {mw['recomputed']:7.2f} s ({refs['recomputed'][0]} refs)  "
                  f"x{rows[-1]['wall_ratio_gate_to_recomputed']:.3f}", flush=True)
            write(args.out, w, args.reps, t0, rows)  # after every case: a call cut short keeps what it measured
    print(f"wrote {args.out}")
    return 0


def write(out: Path, w: Any, reps: int, t0: float, rows: list) -> None:
    doc = {"fingerprint": dict(w.fingerprint), "reps": reps, "wall_s": round(time.time() - t0, 1), "cases": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    sys.exit(main())

"""Put one genome through the full gate many times in one worker process: is a rejection repeatable (a wrong
kernel, or a gate too tight for it) or rare (a race)?

Each repetition is a fresh gate with its own random seed, so its inputs, poison and checked samples differ,
as in a GA evaluation (no peer beside it). Cases come from a JSON file: a list of
{"op", "template", "params", "cell" (a matrix cell's label, or a prefix of one), "reps"}. The output file
records every repetition's status, error and max errors. Rerun on a GPU machine:
python experiments/scripts/regate.py CASES.json --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The cases of a JSON file, each checked for the keys it needs."""
    cases = json.loads(path.read_text())
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{path}: expected a non-empty list of cases")
    for i, c in enumerate(cases):
        missing = {"op", "template", "params", "cell"} - set(c)
        if missing:
            raise ValueError(f"{path}: case {i} lacks {sorted(missing)}")
        if int(c.get("reps", 10)) < 1:
            raise ValueError(f"{path}: case {i} asks for {c['reps']} repetitions")
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("cases", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cases = load_cases(args.cases)
    from evo.build.nvrtc import Builder
    from evo.measure.gate import Gate
    from evo.measure.worker import Worker
    from evo.templates.template import load_templates
    from hand_gate import cell_by_prefix, fresh_rng, hand_job
    from evo.core.registry import get_op

    w = Worker()
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    with Builder(workers=2) as builder:
        for case in cases:
            op = get_op(case["op"])
            tdef = load_templates(op.name)[case["template"]]
            cell = cell_by_prefix(op, case["cell"])
            hj = hand_job(builder, op, tdef, case["params"], cell, seed=11)
            reps = []
            for _ in range(int(case.get("reps", 10))):
                v = hj.judge(hj.gate(Gate, w, fresh_rng()).run())
                reps.append({"status": v.status.value, "error": v.error, "median_us": v.median_us,
                             "max_abs_err": v.max_abs_err, "rel_norm_err": v.rel_norm_err})
            counts = Counter(r["status"] for r in reps)
            rows.append({**case, "cell": cell.label(), "statuses": dict(counts), "reps": reps})
            print(f"{op.name} {tdef.name} {cell.label()}: {dict(counts)}", flush=True)
            for r in reps:
                if r["status"] != "OK":
                    print(f"   {r['status']}: {r['error'][:300]}", flush=True)
            doc = {"fingerprint": dict(w.fingerprint), "wall_s": round(time.time() - t0, 1), "cases": rows}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=2))  # after every case: a call cut short keeps it
    return 0


if __name__ == "__main__":
    sys.exit(main())

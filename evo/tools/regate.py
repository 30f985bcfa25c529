"""One genome or more through the full gate many times in one worker process: is a rejection repeatable (a wrong
kernel, or a gate too tight for it) or rare (a race)? Each repetition is a fresh gate with its own random seed,
so its inputs, poison and checked samples differ, as in a search's evaluation (no peer beside it)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evo.tools.errors import ToolInputError, read_json

DEFAULT_REPS = 10


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The cases of a JSON file ({"op", "template", "params", "cell" (a matrix cell's label or a prefix of one),
    "reps"}), each checked for the keys it needs."""
    cases = read_json(path)
    if not isinstance(cases, list) or not cases:
        raise ToolInputError(f"{path}: expected a non-empty list of cases")
    for i, c in enumerate(cases):
        missing = {"op", "template", "params", "cell"} - set(c)
        if missing:
            raise ToolInputError(f"{path}: case {i} lacks {sorted(missing)}")
        if int(c.get("reps", DEFAULT_REPS)) < 1:
            raise ToolInputError(f"{path}: case {i} asks for {c['reps']} repetitions")
    return cases


def regate(cases: list[dict[str, Any]], out: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every case's repetitions through the gate on this GPU; `out` is rewritten after each case (a run cut short
    keeps what it did) with every repetition's status, error and errors against the reference."""
    from evo.build.nvrtc import Builder
    from evo.measure.gate import Gate
    from evo.measure.worker import Worker
    from evo.templates.template import load_templates
    from evo.tools.hand_gate import cell_by_prefix, fresh_rng, hand_job
    from evo.core.registry import get_op

    w = Worker()
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {}
    t0 = time.time()
    with Builder(workers=2) as builder:
        for case in cases:
            op = get_op(case["op"])
            tdefs = load_templates(op.name)
            if case["template"] not in tdefs:
                raise ToolInputError(f"op {op.name} has no template {case['template']!r}; it has {sorted(tdefs)}")
            tdef = tdefs[case["template"]]
            cell = cell_by_prefix(op, case["cell"])
            hj = hand_job(builder, op, tdef, case["params"], cell, seed=11)
            reps = []
            for _ in range(int(case.get("reps", DEFAULT_REPS))):
                v = hj.judge(hj.gate(Gate, w, fresh_rng()).run())
                reps.append({"status": v.status.value, "error": v.error, "median_us": v.median_us,
                             "max_abs_err": v.max_abs_err, "rel_norm_err": v.rel_norm_err})
            counts = Counter(r["status"] for r in reps)
            rows.append({**case, "cell": cell.label(), "statuses": dict(counts), "reps": reps})
            say(f"{op.name} {tdef.name} {cell.label()}: {dict(counts)}")
            for r in reps:
                if r["status"] != "OK":
                    say(f"   {r['status']}: {r['error'][:300]}")
            doc = {"fingerprint": dict(w.fingerprint), "wall_s": round(time.time() - t0, 1), "cases": rows}
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=2))
    return doc

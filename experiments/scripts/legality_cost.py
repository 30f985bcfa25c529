"""What checking a template's legality costs on the CPU: `TemplateDef.violations` at one point (its constraints
evaluated together in one sandbox call, against one call each), and `legal_points` over a whole space, on the KDA
chunk template (the largest: 27 params, 43 constraints) and fla's first prefill cell. Median of several rounds.

Rerun: python experiments/scripts/legality_cost.py [--out experiments/results/legality_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from evo.templates.template import TemplateError, load_templates
from ops.kda import SPEC

OUT = Path(__file__).resolve().parents[1] / "results" / "legality_cost.json"


def one_at_a_time(t, p: dict, ctx_args: tuple) -> list[str]:
    """violations as one sandbox call a constraint (what it did before the constraints were evaluated together)."""
    ctx = t.context(p, *ctx_args)
    bad = []
    for name, e in t.constraints:
        try:
            if not e.eval(ctx):
                bad.append(name)
        except TemplateError:
            bad.append(name)
    return bad


def median_s(f, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--points", type=int, default=300)
    args = ap.parse_args()
    t = load_templates("kda")["chunk"]
    c = SPEC.matrices["prefill"]()[0]
    dt, dims = c.dtypes_dict(), c.dims_dict()
    legal = t.legal_points(90, dt, dims, fixed={"kwarps": 1})
    pts = random.Random(0).sample(legal, args.points)
    assert all(t.violations(p, 90, dt, dims) == one_at_a_time(t, p, (90, dt, dims)) for p in pts)
    together = median_s(lambda: [t.violations(p, 90, dt, dims) for p in pts], 5) / len(pts)
    alone = median_s(lambda: [one_at_a_time(t, p, (90, dt, dims)) for p in pts], 3) / len(pts)
    space = median_s(lambda: t.legal_points(90, dt, dims, fixed={"kwarps": 1}), 3)
    out = {"what": __doc__.split("\n\n")[0], "template": "kda/chunk", "cell": c.label(),
           "constraints": len(t.constraints), "params": len(t.param_names),
           "violations_us_together": round(together * 1e6, 1), "violations_us_one_call_each": round(alone * 1e6, 1),
           "legal_points": len(legal), "legal_points_s": round(space, 2),
           "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version()}}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

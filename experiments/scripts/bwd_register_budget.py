"""RMSNorm backward's cluster_rows template against its register constraints, compiled (no GPU): every point of the
backward matrix legal but for thread_elements_fit_registers (the template without that one constraint: what the
estimate register_budget let through before it), one build per code-distinct point (the x and w dtypes, N, cluster,
threads, vec, keep_rows,
w_regs, and where a thread holds 32 elements or more the cache hints; groups and reduce_rows do not change
rmsnorm_bwd_rows's code), NVRTC's registers, spill
stores and stack for rmsnorm_bwd_rows, and whether today's template refuses it. The summary groups them by the
elements a thread holds (ceil(N / cluster / (threads vec)) vec) and what it keeps in registers.

Run: python experiments/scripts/bwd_register_budget.py tests/fixtures/results/rmsnorm_bwd_register_budget.json (and .csv)
(KF_NVRTC_ALT=DIR builds with the NVRTC in DIR instead, e.g. the H200 image's 13.0: docs/nvrtc_13_0.md.)
After an edit of the constraint alone: python experiments/scripts/bwd_register_budget.py --recount FILE (no builds).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from evo.build.nvrtc import Builder, prepare
from evo.core.genome import Genome
from evo.templates.template import load_templates, parse_template
from evo.core.registry import get_op


def elements(N: int, p: dict) -> int:
    """The elements of its row slice a thread of rmsnorm_bwd_rows holds: its items times vec."""
    return -(-(N // p["cluster"]) // (p["threads"] * p["vec"])) * p["vec"]


NEW = "thread_elements_fit_registers"


def without_new(t):
    """t without the constraint NEW and the comment lines right above it: the template's text as it was before."""
    lines = t.text.splitlines(keepends=True)
    at = [i for i, ln in enumerate(lines) if ln.startswith(NEW + " = ")]
    assert len(at) == 1, f"{NEW} not found once in {t.name}"
    first = at[0]
    while lines[first - 1].startswith("#"):
        first -= 1
    return parse_template("".join(lines[:first] + lines[at[0] + 1:]), f"{t.name} without {NEW}", trusted=True)


def distinct_points(t) -> dict[tuple, tuple]:
    """{(x dtype, w dtype, N, cluster, threads, vec, keep_rows, w_regs, load_hint, store_hint): (cell, params)} over t's
    legal points on the backward matrix (the first legal point of each key). The cache hints change the registers
    (ld.global.nc takes more) where a thread holds 32 elements or more; below that they are left out of the key (None:
    the first legal point's)."""
    out: dict[tuple, tuple] = {}
    for c in get_op("rmsnorm_bwd").matrix():
        dt = {k: getattr(v, "value", str(v)) for k, v in c.dtypes_dict().items()}
        for p in t.legal_points(90, c.dtypes_dict(), c.dims_dict()):
            hints = (p["load_hint"], p["store_hint"]) if elements(c.dim("N"), p) >= 32 else (None, None)
            key = (dt["x"], dt["w"], c.dim("N"), p["cluster"], p["threads"], p["vec"], p["keep_rows"], p["w_regs"],
                   *hints)
            out.setdefault(key, (c, p))
    return out


def summarize(t, rows: list[dict]) -> dict:
    """The rows grouped by elements a thread, threads over 256, keep_rows, w_regs, an nc load and the x dtype; the
    totals; printed."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        key = (r["elements"], r["threads"] > 256, r["keep_rows"], r["w_regs"], r["load_hint"] == "nc", r["x"])
        groups[key].append(r)
    summary = []
    for (elems, wide, keep, wr, nc, x), rs in sorted(groups.items()):
        spill = [r for r in rs if r["spill_stores"] or r["stack_bytes"]]
        summary.append({"elements": elems, "threads_over_256": wide, "keep_rows": keep, "w_regs": wr, "load_nc": nc,
                        "x": x, "points": len(rs), "spilling": len(spill), "refused": sum(r["refused"] for r in rs),
                        "spilling_and_legal": sum(not r["refused"] for r in spill),
                        "regs": [min(r["regs"] for r in rs), max(r["regs"] for r in rs)]})
        print(f"{elems:4d} elements, threads {'> 256' if wide else '<= 256'}, keep_rows {keep!s:5}, w_regs {wr!s:5}, "
              f"nc {nc!s:5}, x {x:9}: {len(rs):3d} points, {len(spill):3d} spill, {summary[-1]['refused']:3d} refused, "
              f"registers {summary[-1]['regs']}")
    total = {k: sum(s[k] for s in summary) for k in ("spilling", "refused", "spilling_and_legal")}
    print(f"{len(rows)} code-distinct points legal before {NEW}: {total['spilling']} spill, {total['refused']} refused "
          f"by it, {total['spilling_and_legal']} spill and stay legal")
    return {"template_source_hash": t.source_hash, "points": len(rows), **total, "summary": summary}


COLUMNS = ("x", "w", "N", "cluster", "threads", "vec", "keep_rows", "w_regs", "load_hint", "store_hint", "elements",
           "regs", "spill_stores", "spill_loads", "stack_bytes", "refused", "compiler")


def write(path: str, doc: dict, rows: list[dict]) -> None:
    """The summary to `path` (JSON), the rows beside it as CSV (the same name, .csv)."""
    Path(path).write_text(json.dumps(doc | {"rows_csv": Path(path).with_suffix(".csv").name}, indent=1) + "\n")
    with open(Path(path).with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)


def read_rows(path: str) -> list[dict]:
    """The CSV rows written beside `path`, typed."""
    ints = {"N", "cluster", "threads", "vec", "elements", "regs", "spill_stores", "spill_loads", "stack_bytes"}
    with open(Path(path).with_suffix(".csv"), newline="") as f:
        return [{k: int(v) if k in ints else (v == "True" if k in ("keep_rows", "w_regs", "refused") else v)
                 for k, v in r.items()} for r in csv.DictReader(f)]


def recount(path: str) -> None:
    """A written file's `refused` and summary again under today's template, without building: a constraint edit
    changes which points are legal, not their code (tests/unit/test_regime_templates.py checks the rendered code)."""
    t = load_templates("rmsnorm_bwd")["cluster_rows"]
    doc = json.loads(Path(path).read_text())
    rows = read_rows(path)
    cells = {(getattr(c.dtype("x"), "value", ""), c.dim("N")): c for c in get_op("rmsnorm_bwd").matrix()}
    for r in rows:
        c = cells[(r["x"], r["N"])]
        p = t.default_params() | {k: r[k] for k in ("cluster", "threads", "vec", "keep_rows", "w_regs", "load_hint",
                                                      "store_hint")}
        r["refused"] = not t.is_valid(p, 90, c.dtypes_dict(), c.dims_dict())
    write(path, doc | summarize(t, rows) | {"recounted": True}, rows)


def main(out: str) -> None:
    t = load_templates("rmsnorm_bwd")["cluster_rows"]
    points = distinct_points(without_new(t))
    inputs = [prepare(t, Genome.make("rmsnorm_bwd", "cluster_rows", t.source_hash, p), "sm_90a", c.dtypes_dict(),
                      c.dims_dict()) for c, p in points.values()]
    builder = Builder(2, nvrtc=os.environ.get("KF_NVRTC_ALT") or None)  # another NVRTC where that names one
    rows = []
    for (key, (c, p)), r in zip(points.items(), builder.build(inputs)):
        if not r.status.ok:
            raise SystemExit(f"{key}: {r.status.name} {r.error}")
        res = dict(r.resources)["rmsnorm_bwd_rows"]
        rows.append({"x": key[0], "w": key[1], "N": key[2], "cluster": key[3], "threads": key[4], "vec": key[5],
                     "keep_rows": key[6], "w_regs": key[7], "load_hint": p["load_hint"], "store_hint": p["store_hint"],
                     "elements": elements(key[2], p), "regs": res.regs,
                     "spill_stores": res.spill_stores, "spill_loads": res.spill_loads, "stack_bytes": res.stack_bytes,
                     "refused": not t.is_valid(p, 90, c.dtypes_dict(), c.dims_dict()), "compiler": r.compiler})
    write(out, {"what": __doc__.split("\n\n")[0], "compiler": rows[0]["compiler"], **summarize(t, rows)}, rows)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--recount"]:
        recount(sys.argv[2])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "rmsnorm_bwd_register_budget.json")

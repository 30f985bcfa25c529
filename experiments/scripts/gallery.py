"""Run the adversarial galleries on the GPU (RMSNorm's forward, tests/gpu/gallery_run.py, and the template galleries of
KDA and the RMSNorm backward, tests/gpu/gallery_templates.py) and write their outcomes as JSON (rerun:
python experiments/scripts/gallery.py).

Besides the gallery's own honest control, it times the cta_row template's default point through the
same gate on six matrix cells and, given --baseline (a `kfactory bench` CSV of an earlier run), puts those medians
beside the baseline's (a cross-run ratio, reported as such).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _gallery_run(name: str):
    """tests/gpu/NAME.py, a gallery the GPU tests run (loaded from its file: tests/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


_run = _gallery_run("gallery_run")
CELLS, CHEATS, run_gallery = _run.CELLS, _run.CHEATS, _run.run_gallery

CONTROL_CELLS = ("w=bf16,x=bf16 M4096-N1024", "w=bf16,x=bf16 M4096-N2048", "w=bf16,x=bf16 M32768-N4096",
                 "w=fp16,x=fp16 M32768-N32768", "w=fp32,x=fp32 M4096-N8192", "w=fp32,x=fp32 M32768-N16384")


def honest_controls(baseline: Path | None = None, timing_s: float = 30.0) -> list[dict]:
    """cta_row at its default point (repaired per cell) through the new gate, beside a baseline bench's medians."""
    from evo import bench, get_op, GpuRunner, load_templates, Timing

    op = get_op("rmsnorm")
    old = {} if baseline is None else {r["cell"]: r for r in csv.DictReader(open(baseline))
                                       if r["candidate"] == "cta_row"}
    cells = [c for c in op.matrix() if c.label() in CONTROL_CELLS]
    tdef = load_templates("rmsnorm")["cta_row"]
    with GpuRunner(timeout_s=120.0) as runner:
        rows = bench(op, [("cta_row", tdef, None)], cells, "sm_90a", runner, Timing())
    out = []
    for c in (r.columns() for r in rows):
        before = float(old[c["cell"]]["median_us"]) if c["cell"] in old else float("nan")
        out.append({"cell": c["cell"], "status": c["status"], "median_us": c["median_us"],
                    "baseline_us": c["baseline_us"], "graph": c["graph"], "committed_median_us": before,
                    "ratio_to_committed": c["median_us"] / before, "params": c["params"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gallery_h200.json")
    ap.add_argument("--no-controls", action="store_true", help="skip the cta_row honest controls")
    ap.add_argument("--templates-only", action="store_true",
                    help="only the template galleries (KDA, the RMSNorm backward, the forward's variant cases)")
    ap.add_argument("--baseline", type=Path, help="a bench CSV whose cta_row medians the controls are compared with")
    args = ap.parse_args()
    t0 = time.time()
    templates = _gallery_run("gallery_templates")
    if args.templates_only:
        outcomes, restarts, ceiling = [], 0, None
        template_outcomes, fingerprint = templates.run_gallery()
    else:
        outcomes, fingerprint, restarts, ceiling = run_gallery()
        template_outcomes, _ = templates.run_gallery()
    passed = all(o.passed for o in outcomes) and all(o.passed for o in template_outcomes)
    controls = [] if args.no_controls else honest_controls(args.baseline)
    doc = {"cells": {k: c.label() for k, c in CELLS.items()}, "fingerprint": fingerprint, "ceiling_gbps": ceiling,
           "worker_restarts": restarts, "wall_s": round(time.time() - t0, 1), "all_as_expected": passed,
           "cheats": len(CHEATS), "cheats_rejected": sum(o.name in CHEATS and o.got != "OK" for o in outcomes),
           "cheat_runs": sum(o.name in CHEATS for o in outcomes),
           "outcomes": [asdict(o) for o in outcomes], "honest_controls": controls,
           "templates": {op: {"cell": g.cell.label(), "small_cell": g.small.label(),
                              "outcomes": [asdict(o) for o in template_outcomes if o.op == op]}
                         for op, g in templates.GALLERIES.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    for o in outcomes:
        print(f"{o.name:<17} {o.cell:<26} {o.got:<14} {'ok ' if o.passed else 'BAD'} graph={o.graph!s:<5} "
              f"{o.median_us:9.2f} us {o.gbps:6.0f} GB/s  {o.error[:80]}")
    for o in template_outcomes:
        print(f"{o.op:<11} {o.cheat:<19} {o.got:<14} {'ok ' if o.passed else 'BAD'} {o.cell[:40]:<40} {o.error[:100]}")
    for c in controls:
        print(f"control cta_row {c['cell']:<28} {c['status']:<8} {c['median_us']:9.2f} us vs committed "
              f"{c['committed_median_us']:9.2f} us  x{c['ratio_to_committed']:.3f}")
    print(f"all as expected: {passed}; worker restarts: {restarts}; wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

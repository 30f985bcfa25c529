"""Run the adversarial gallery on the GPU and write its outcome as JSON (rerun: python experiments/scripts/gallery.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gpu.gallery_run import CELL, run_gallery  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "gallery_h200.json")
    args = ap.parse_args()
    t0 = time.time()
    outcomes, fingerprint, restarts = run_gallery()
    passed = all(o.got == o.expected for o in outcomes)
    doc = {"cell": CELL.label(), "fingerprint": fingerprint, "worker_restarts": restarts,
           "wall_s": round(time.time() - t0, 1), "all_as_expected": passed,
           "outcomes": [asdict(o) for o in outcomes]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    for o in outcomes:
        print(f"{o.name:<11} expected {o.expected:<13} got {o.got:<13} {o.error[:90]}")
    print(f"all as expected: {passed}; worker restarts: {restarts}; wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

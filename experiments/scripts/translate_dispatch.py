"""Translate dispatch tables across dtypes by bytes per row: a row-wise kernel that is fastest on 16-bit rows of
N elements is a candidate for fp32 rows of N / 2 elements (the same bytes a row, the same loads a thread) with
its vector width in elements scaled to keep the bytes a load (16-bit vec 8 -> fp32 vec 4), and the reverse.
The result is a table of predictions, not of measurements: its entries carry no median, only the cell and
time they came from, and the table says `"kind": "predictions"`, so that `[search] seed_tables` starts a run
from each of them beside the cell's fastest measured entry (the run times them; evo/loop/seed_tables.py).

On the H200 (experiments/results/rmsnorm_peers_h200/fwd_hold_fp16_fp32.md) fp16 M32768-N8192 ran at 100% of
the copy ceiling with cta_row_l2 while fp32 M32768-N4096, the same bytes, ran at 98% with cta_row: the
searches had not tried the byte-equivalent genome there.

    python experiments/scripts/translate_dispatch.py OUT.json TABLE.json [MORE.json ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SIZES = {"bf16": 2, "fp16": 2, "fp32": 4}
ELEMENT_PARAMS = ("vec",)  # parameters counted in elements (scaled with the element size)
_LABEL = re.compile(r"(?P<dtypes>[^ ]+) M(?P<M>\d+)-N(?P<N>\d+)")


def _parse(label: str) -> tuple[dict[str, str], int, int] | None:
    m = _LABEL.fullmatch(label)
    if not m:
        return None
    pairs = [p.split("=", 1) for p in m["dtypes"].split(",")]
    if any(len(p) != 2 for p in pairs):
        return None
    return dict(pairs), int(m["M"]), int(m["N"])


def translate(tables: list[dict]) -> dict:
    """Per cell of the tables, its fastest entry (lowest median_us) carried to every other dtype whose cell has
    the same bytes a row, where the sizes divide evenly; a cell a table measured itself is still given the
    translations (they are predictions beside its measurement). Cells with mixed dtypes are not translated."""
    best: dict[str, dict] = {}
    for t in tables:
        if not isinstance(t.get("dispatch"), dict):
            raise ValueError("translate_dispatch: a table has no 'dispatch' object")
        for label, e in t["dispatch"].items():
            m = e.get("median_us")
            if isinstance(m, (int, float)) and (label not in best or m < best[label]["median_us"]):
                best[label] = e
    out: dict[str, dict] = {}
    for label, e in sorted(best.items()):
        parsed = _parse(label)
        if parsed is None:
            continue
        dtypes, m, n = parsed
        kinds = set(dtypes.values())
        if len(kinds) != 1 or not kinds <= set(SIZES):
            continue
        (src,) = kinds
        for dst, size in SIZES.items():
            if size == SIZES[src]:
                continue
            if (n * SIZES[src]) % size:
                continue
            params = dict(e["params"])
            ok = True
            for p in ELEMENT_PARAMS:
                if p in params:
                    scaled = params[p] * SIZES[src]
                    ok = ok and scaled % size == 0 and scaled // size >= 1
                    params[p] = scaled // size
            if not ok:
                continue
            new = ",".join(f"{k}={dst}" for k in dtypes) + f" M{m}-N{n * SIZES[src] // size}"
            cand = {"template": e["template"], "params": params, "translated_from": label,
                    "source_median_us": e["median_us"]}
            # several sources of one cell (bf16 and fp16 into fp32): keep the fastest source
            if new not in out or e["median_us"] < out[new]["source_median_us"]:
                out[new] = cand
    return {"run_id": None, "kind": "predictions", "translated_from": [t.get("run_id") for t in tables],
            "note": "predictions by bytes per row (experiments/scripts/translate_dispatch.py), not measurements",
            "dispatch": dict(sorted(out.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("tables", type=Path, nargs="+")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.tables if not p.is_file()]
    if missing:
        print(f"translate_dispatch: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    doc = translate([json.loads(p.read_text()) for p in args.tables])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"translate_dispatch: {len(doc['dispatch'])} cells predicted from {len(args.tables)} table(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

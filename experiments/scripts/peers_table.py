"""One table of the factory's dispatch entries against every peer, from `kfactory bench --dispatch` files.

Each bench row times one dispatch entry and the peers named in that bench call, interleaved in one
process on the same inputs (the gate's timing loop). Several bench files of the same dispatch table
(say one call with torch and Liger, another with QuACK) are combined per cell; every ratio stays the
ratio of its own process: ratio(peer) = peer's median / the entry's median in the call that timed
that peer. "vs best peer" is the smallest of those ratios. Nothing is compared across processes.

With --latest the files are benches of different tables (a matrix measured in several calls, a cell measured
again after a new search): each cell is taken whole from the last file that timed it (OK), its ratios all from
that one process.

Usage: python experiments/scripts/peers_table.py [--latest] OUT_PREFIX BENCH.csv [BENCH.csv ...]
writes OUT_PREFIX.json (cells, summary, fingerprints) and OUT_PREFIX.md.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

LOW_CEILING = 0.70  # cells where the best peer reaches under 70% of the copy ceiling
HIGH_CEILING = 0.90  # cells where the best peer reaches 90% of it or more: little left to take there


def read(path: Path) -> tuple[list[dict], dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    meta = json.loads(path.with_suffix(".json").read_text())
    return rows, meta


def combine(files: list[Path], latest: bool = False) -> dict:
    cells: dict[str, dict] = {}
    fingerprints, absent = {}, {}
    read_all = [(path, *read(path)) for path in files]
    owner = {r["cell"]: path.name for path, rows, _ in read_all for r in rows if r["status"] == "OK"} if latest else {}
    for path, rows, meta in read_all:
        fingerprints[path.name] = meta["fingerprint"]
        ceiling = float(meta["copy_ceiling_gbps"])
        for r in rows:
            if latest and owner.get(r["cell"], path.name) != path.name:
                continue  # a later file timed this cell again
            c = cells.setdefault(r["cell"], {"cell": r["cell"], "genome": r["genome_key"][:12], "template": r["template"],
                                             "bytes": None, "ours_us": {}, "peers": {}, "file": path.name})
            if r["status"] != "OK":
                c["ours_us"][path.name] = None
                continue
            ours = float(r["median_us"])
            c["ours_us"][path.name] = ours
            c["bytes"] = float(r["gbps"]) * 1e9 * ours * 1e-6
            for name, us in json.loads(r["peers"]).items():
                c["peers"][name] = {"us": us, "ours_us": ours, "ratio": us / ours, "file": path.name,
                                    "pct_ceiling": 100.0 * (c["bytes"] / (us * 1e-6) / 1e9) / ceiling,
                                    "ours_pct_ceiling": 100.0 * float(r["gbps"]) / ceiling}
            for name, why in json.loads(r["absent"] or "{}").items():
                if name not in c["peers"]:
                    absent.setdefault(name, set()).add(why)
    for c in cells.values():  # a peer timed in one file and absent in another is present
        best = min(c["peers"].items(), key=lambda kv: kv[1]["ratio"]) if c["peers"] else None
        c["best_peer"] = best[0] if best else ""
        c["vs_best_peer"] = best[1]["ratio"] if best else 0.0
        c["best_peer_pct_ceiling"] = best[1]["pct_ceiling"] if best else 0.0
        c["ours_pct_ceiling"] = best[1]["ours_pct_ceiling"] if best else 0.0  # in the best peer's process
    ok = [c for c in cells.values() if c["best_peer"]]
    low = [c for c in ok if c["best_peer_pct_ceiling"] < 100 * LOW_CEILING]
    present = sorted({n for c in cells.values() for n in c["peers"]})
    summary = {
        "cells": len(cells), "cells_with_a_peer": len(ok),
        "geomean_vs_best_peer": geomean(c["vs_best_peer"] for c in ok),
        "worst_vs_best_peer": min((c["vs_best_peer"] for c in ok), default=0.0),
        "cells_at_or_above_best_peer": sum(c["vs_best_peer"] >= 1.0 for c in ok),
        "cells_best_peer_under_70pct_ceiling": len(low),
        "cells_best_peer_at_or_over_90pct_ceiling": sum(c["best_peer_pct_ceiling"] >= 100 * HIGH_CEILING for c in ok),
        "geomean_vs_best_peer_where_it_is_under_70pct_ceiling": geomean(c["vs_best_peer"] for c in low),
        "geomean_vs_peer": {n: geomean(c["peers"][n]["ratio"] for c in ok if n in c["peers"]) for n in present},
        "cells_per_peer": {n: sum(n in c["peers"] for c in ok) for n in present},
        "absent": {n: sorted(w) for n, w in absent.items() if not any(n in c["peers"] for c in cells.values())},
        "absent_on_some_cells": {n: sorted(w) for n, w in absent.items() if any(n in c["peers"] for c in cells.values())},
    }
    return {"summary": summary, "cells": sorted(cells.values(), key=lambda c: c["cell"]), "fingerprints": fingerprints,
            "method": __doc__.split("\n\n")[1].replace("\n", " ")}


def geomean(xs) -> float:
    v = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else 0.0


def markdown(t: dict) -> str:
    s = t["summary"]
    peers = sorted(s["geomean_vs_peer"])
    lines = [f"# Dispatch entries against every peer ({s['cells']} cells)", "",
             f"geomean vs best peer {s['geomean_vs_best_peer']:.3f}, worst {s['worst_vs_best_peer']:.3f}, "
             f"{s['cells_at_or_above_best_peer']}/{s['cells_with_a_peer']} cells at or above the best peer.", "",
             f"The best peer runs at {100 * HIGH_CEILING:.0f}% of the copy ceiling or more on "
             f"{s['cells_best_peer_at_or_over_90pct_ceiling']} cells, under {100 * LOW_CEILING:.0f}% on "
             f"{s['cells_best_peer_under_70pct_ceiling']} (% ceil: bytes moved over the median, against the run's "
             "measured copy ceiling).", "",
             "| cell | template | µs (ours) | " + " | ".join(peers) + " | best peer | vs best peer | % ceil ours | % ceil best peer |",
             "|---|---|---:|" + "---:|" * len(peers) + "---|---:|---:|---:|"]
    for c in t["cells"]:
        ours = "/".join(f"{v:.1f}" for v in c["ours_us"].values() if v)
        cols = [f"{c['peers'][p]['us']:.1f} ({c['peers'][p]['ratio']:.3f}x)" if p in c["peers"] else "absent"
                for p in peers]
        lines.append(f"| {c['cell']} | {c['template']} | {ours} | " + " | ".join(cols)
                     + f" | {c['best_peer']} | {c['vs_best_peer']:.3f} | {c['ours_pct_ceiling']:.0f} | "
                     f"{c['best_peer_pct_ceiling']:.0f} |")
    lines += ["", "Peers absent everywhere: " + ("; ".join(f"{n}: {w[0]}" for n, w in s["absent"].items()) or "none"),
              "Peers absent on some cells: " + ("; ".join(f"{n}: {w[0]}" for n, w in s["absent_on_some_cells"].items())
                                                or "none"), "", "Method: " + t["method"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    latest = "--latest" in argv
    argv = [a for a in argv if a != "--latest"]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, files = Path(argv[0]), [Path(a) for a in argv[1:]]
    t = combine(files, latest)
    out.with_suffix(".json").write_text(json.dumps(t, indent=1, sort_keys=True, default=sorted))
    out.with_suffix(".md").write_text(markdown(t))
    s = t["summary"]
    print(f"{out}: geomean vs best peer {s['geomean_vs_best_peer']:.3f}, worst {s['worst_vs_best_peer']:.3f}, "
          f"{s['cells_at_or_above_best_peer']}/{s['cells_with_a_peer']} cells >= best peer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

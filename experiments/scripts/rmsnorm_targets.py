"""The RMSNorm package's published benches against its targets, cell by cell: what meets them, what misses and by how
much. Reads the package bench files of a results folder (experiments/results/rmsnorm/<card>/rmsnorm_bench_*.json);
writes nothing but the markdown it prints (or --out).

    python experiments/scripts/rmsnorm_targets.py [FOLDER] [--out targets.md]

experiments/results/rmsnorm/h100/targets.md is its output for that folder (a CPU test keeps it current).

The targets (kernel time unless said; "best peer" is the fastest correct peer of the cell, the package's own
diagnostic sides, package.into and the like, excluded):
- forward and residual: each cell at least 1.00x the best peer, or at least 97% of the copy ceiling and at least 0.99x;
  where the best peer is under 70% of the ceiling, at least 1.10x each and 1.25x geomean over those cells;
- serving and serving_residual: call time at least 1.00x the best peer on each cell, geomean at least 1.3x QuACK's;
- backward: each cell at least 1.00x QuACK autotuned and the best peer, geomean at least 1.15x QuACK autotuned;
- train: each cell at least 1.10x the best peer's step.
A table whose file stopped early says so; a cell without the peer a target names says the peer is absent.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "package"


def _gm(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _best(sides: dict[str, Any], column: str) -> tuple[str, float] | None:
    ok = [(n, s[f"{column}_us"]) for n, s in sides.items()
          if n != PACKAGE and not n.startswith(PACKAGE + ".") and s.get("status") == "ok" and s.get(f"{column}_us")]
    return min(ok, key=lambda t: t[1]) if ok else None


def _ratio(sides: dict[str, Any], peer: str, column: str) -> float | None:
    s = sides.get(peer, {})
    if s.get("status") != "ok":
        return None
    return s[f"{column}_us"] / sides[PACKAGE][f"{column}_us"]


def _kernel_cell(r: dict[str, Any], ok: Any, why: str) -> dict[str, Any]:
    """A cell judged by kernel time against its best peer: `ok(x)` on the package's ratio to it (None: no peer)."""
    sides = r["sides"]
    best = _best(sides, "kernel")
    x = best[1] / sides[PACKAGE]["kernel_us"] if best else None
    return {"cell": r["cell"], "x": x, "pct": sides[PACKAGE].get("pct_ceiling"), "best": best[0] if best else None,
            "best_pct": sides[best[0]].get("pct_ceiling") if best else None,
            "verdict": "meets" if ok(x) else "misses", "why": why}


def check_table(kind: str, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Per cell: (cell, ratio, % of ceiling, best peer, verdict, why) and the table-wide verdict lines."""
    out, notes = [], []
    if kind in ("forward", "residual"):
        low = []
        for r in rows:
            sides = r["sides"]
            best = _best(sides, "kernel")
            if best is None:
                out.append({"cell": r["cell"], "verdict": "no peer", "why": "no correct peer timed"})
                continue
            x = best[1] / sides[PACKAGE]["kernel_us"]
            pct, peer_pct = sides[PACKAGE].get("pct_ceiling"), sides[best[0]].get("pct_ceiling")
            if peer_pct is not None and peer_pct < 70:
                low.append(x)
                ok, rule = x >= 1.10, "best peer under 70% of the ceiling: >= 1.10x"
            elif x >= 1.0:
                ok, rule = True, ">= 1.00x"
            else:
                ok, rule = pct is not None and pct >= 97 and x >= 0.99, ">= 97% of the ceiling and >= 0.99x"
            out.append({"cell": r["cell"], "x": x, "pct": pct, "best": best[0], "best_pct": peer_pct,
                        "verdict": "meets" if ok else "misses", "why": rule})
        if low:
            g = _gm(low)
            notes.append(f"cells whose best peer is under 70% of the ceiling: geomean {g:.3f}x "
                         f"({'meets' if g >= 1.25 else 'misses'} 1.25x)")
    elif kind in ("serving", "serving_residual"):
        vs_quack = []
        for r in rows:
            sides = r["sides"]
            best = _best(sides, "call")
            q = _ratio(sides, "quack", "call")
            if q is not None:
                vs_quack.append(q)
            if best is None:
                out.append({"cell": r["cell"], "verdict": "no peer", "why": "no correct peer timed"})
                continue
            x = best[1] / sides[PACKAGE]["call_us"]
            out.append({"cell": r["cell"], "x": x, "pct": sides[PACKAGE].get("pct_ceiling"), "best": best[0],
                        "best_pct": sides[best[0]].get("pct_ceiling"), "verdict": "meets" if x >= 1.0 else "misses",
                        "why": "call time >= 1.00x"})
        g = _gm(vs_quack)
        notes.append(f"call time against QuACK: geomean {g:.3f}x over {len(vs_quack)} cells "
                     f"({'meets' if vs_quack and g >= 1.3 else 'misses'} 1.3x)" if vs_quack else
                     "call time against QuACK: QuACK absent")
    elif kind == "backward":
        tuned = []
        for r in rows:
            q = _ratio(r["sides"], "quack.autotuned", "kernel")
            if q is not None:
                tuned.append(q)
            out.append(_kernel_cell(r, lambda x, q=q: q is not None and q >= 1.0 and x is not None and x >= 1.0,
                                    ">= 1.00x QuACK autotuned and the best peer" if q is not None
                                    else "QuACK autotuned absent"))
        notes.append(f"against QuACK autotuned: geomean {_gm(tuned):.3f}x over {len(tuned)} cells "
                     f"({'meets' if tuned and _gm(tuned) >= 1.15 else 'misses'} 1.15x)" if tuned else
                     "against QuACK autotuned: absent")
    elif kind == "train":
        out = [_kernel_cell(r, lambda x: x is not None and x >= 1.10, "step >= 1.10x") for r in rows]
    return out, notes


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def report(folder: Path) -> str:
    """The markdown report of every bench file of `folder`, a table per (file, table)."""
    lines = [f"# RMSNorm targets: `{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}`", ""]
    files = sorted(folder.glob("rmsnorm_bench_*.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no rmsnorm_bench_*.json")
    for path in files:
        doc = json.loads(path.read_text())
        for table in doc.get("tables") or sorted({c["table"] for c in doc["cells"]}):
            rows = [c for c in doc["cells"] if c["table"] == table]
            if not rows:
                continue
            cells, notes = check_table(table, rows)
            stopped = "" if doc.get("complete", True) else f", stopped after {len(doc['cells'])} cells"
            misses = sum(c["verdict"] != "meets" for c in cells)
            lines += [f"## {table}{', cells ' + doc['cells_regex'] if doc.get('cells_regex') else ''}{stopped} "
                      f"({path.name}, {doc['environment']['card']['name']})", "",
                      "; ".join([f"{len(cells) - misses} of {len(cells)} cells meet their target", *notes]), "",
                      "| cell | package vs best peer | package % of ceiling | best peer | its % of ceiling | target | verdict |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {c['cell']} | {_fmt(c.get('x'), '.3f')}x | {_fmt(c.get('pct'), '.0f')} | {c.get('best') or ''} | "
                      f"{_fmt(c.get('best_pct'), '.0f')} | {c['why']} | {c['verdict']} |" for c in cells]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT / "experiments" / "results" / "rmsnorm" / "h100")
    ap.add_argument("--out", type=Path, help="write the markdown here instead of printing it")
    args = ap.parse_args(argv)
    try:
        text = report(args.folder.resolve())
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as e:
        print(f"rmsnorm_targets.py: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

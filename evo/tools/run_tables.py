"""Tables of one run's evaluations, each ratio within the run (one process, one timing loop): the fastest OK time
per (cell, template) against the cell's winner, and each dispatch entry against the run's copy ceiling and the
op's first peer timed in the same job."""

from __future__ import annotations

import json
import math

import pandas as pd

from evo.tools.errors import ToolInputError


def _fingerprint(ev: pd.DataFrame) -> dict:
    return json.loads(ev.fingerprint_json.dropna().iloc[0]) if ev.fingerprint_json.notna().any() else {}


def templates(ev: pd.DataFrame) -> dict:
    """Per cell: the fastest OK median of each template; ratios are that template's time / the winner's."""
    if ev.empty:
        raise ToolInputError("the evaluations file has no rows")
    ok = ev[ev.status == "OK"]
    best = ok.groupby(["cell", "template"]).median_us.min().unstack()
    names = sorted(best.columns)
    cells = []
    for cell, row in best.sort_index().iterrows():
        have = {t: float(row[t]) for t in names if not math.isnan(row[t])}
        win = min(have, key=have.get)
        cells.append({"cell": cell, "winner": win, "us": have,
                      "vs_winner": {t: have[t] / have[win] for t in have}})
    failures = ev[ev.status != "OK"].groupby(["template", "status"]).size()
    return {
        "run_id": str(ev.run_id.iloc[0]), "evaluations": len(ev), "templates": names,
        "wins": {t: sum(c["winner"] == t for c in cells) for t in names},
        "evaluations_per_template": ev.groupby("template").size().to_dict(),
        "failures": [{"template": t, "status": s, "n": int(n)} for (t, s), n in failures.items()],
        "failure_examples": {t: str(g.error.iloc[0])[:300] for t, g in ev[ev.status != "OK"].groupby("template")},
        "cells": cells,
        "fingerprint": _fingerprint(ev),
    }


def templates_md(doc: dict) -> str:
    """The templates table as markdown."""
    names = doc["templates"]
    lines = [f"# Fastest time per template and cell, run {doc['run_id']} ({doc['evaluations']} evaluations)", "",
             "Each ratio is the template's fastest OK time over the cell's winner, within this one run.", "",
             "| cell | winner | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for c in doc["cells"]:
        cols = [f"{c['us'][t]:.1f} ({c['vs_winner'][t]:.3f})" if t in c["us"] else "-" for t in names]
        lines.append(f"| {c['cell']} | {c['winner']} | " + " | ".join(cols) + " |")
    lines += ["", "Wins: " + ", ".join(f"{t} {n}" for t, n in doc["wins"].items()), ""]
    for f in doc["failures"]:
        lines.append(f"- {f['template']}: {f['n']} x {f['status']} (e.g. {doc['failure_examples'][f['template']][:160]})")
    return "\n".join(lines) + "\n"


def ceiling(ev: pd.DataFrame, dispatch: dict) -> dict:
    """Each dispatch entry's own fastest OK row: time, bandwidth as a share of the ceiling, the peer beside it."""
    if not isinstance(dispatch.get("dispatch"), dict):
        raise ToolInputError("the dispatch table has no 'dispatch' object")
    rows = []
    for cell, e in sorted(dispatch["dispatch"].items()):
        r = ev[(ev.genome_key == e["genome_key"]) & (ev.cell == cell) & (ev.status == "OK")]
        if r.empty:
            continue
        r = r.sort_values("median_us").iloc[0]
        peer = float(r.baseline_us) if r.baseline_us == r.baseline_us else None
        rows.append({"cell": cell, "params": e["params"], "us": float(r.median_us), "gbps": float(r.gbps),
                     "ceiling_gbps": float(r.ceiling_gbps), "share_of_ceiling": float(r.gbps / r.ceiling_gbps),
                     "peer_us_same_job": peer, "peer_over_ours": peer / float(r.median_us) if peer else None})
    return {"run_id": dispatch.get("run_id"), "cells": rows, "fingerprint": _fingerprint(ev)}


def ceiling_md(doc: dict) -> str:
    """The ceiling table as markdown."""
    lines = [f"# Dispatch entries against the copy ceiling, run {doc['run_id']}", "",
             "Bandwidth is the op's bytes moved over the median time; the ceiling is the run's measured "
             "device copy; the peer is the op's first baseline timed in the same job.", "",
             "| cell | us | GB/s | % of ceiling | peer us (same job) | peer / ours |", "|---|---:|---:|---:|---:|---:|"]
    for r in doc["cells"]:
        peer = f"{r['peer_us_same_job']:.1f} | {r['peer_over_ours']:.2f}" if r["peer_us_same_job"] else "absent | -"
        lines.append(f"| {r['cell']} | {r['us']:.1f} | {r['gbps']:.0f} | {100 * r['share_of_ceiling']:.1f}% | {peer} |")
    return "\n".join(lines) + "\n"

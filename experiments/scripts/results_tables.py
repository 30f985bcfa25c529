"""The published result tables, generated from the canonical result folders.

A canonical folder is `experiments/results/<op>/<card>/`: the exported package's own benchmark
(`<op>_bench_<tag>.json`, written by `python -m <package>.bench`), run on one card, with the commands that rebuild
it (`commands.sh`). Each benchmark file is one process; each of its tables becomes one markdown table here, with
the card, the date, the driver, torch and every peer's version beside it, so no table joins processes.

    python experiments/scripts/results_tables.py           rewrite the generated blocks of README.md and
                                                           docs/results.md
    python experiments/scripts/results_tables.py --check   exit 1 when a committed block differs from what the
                                                           folders give (a CPU test runs this)

A generated block sits between `<!-- results_tables:NAME -->` and `<!-- /results_tables -->` (NAME: summary for
the README's one table, details for every table in docs/results.md); the text around the blocks is left alone.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
TARGETS = {"summary": ROOT / "README.md", "details": ROOT / "docs" / "results.md"}
OPS = {"rmsnorm": "RMSNorm", "kda": "KDA"}  # the published ops, in the order they are shown
# the tables of an op, in the order they are shown
ORDER = ("forward", "residual", "backward", "train", "serving", "serving_residual", "prefill", "varlen", "decode")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours some peers put in their error messages
BLOCK = re.compile(r"(<!-- results_tables:(\w+) -->\n)(.*?)(<!-- /results_tables -->)", re.S)
PACKAGE = "package"


@dataclass(frozen=True)
class Table:
    """One table of one benchmark file: its rows (cells), the file's header and where it is."""
    op: str
    card: str
    name: str  # the bench's table, with the file's cell filter where it had one ("forward, cells x=bf16")
    rows: tuple[dict[str, Any], ...]
    doc: dict[str, Any]
    path: Path  # as the repository names it: experiments/results/<op>/<card>/<file>


def card_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; a card without an H100/H200 in its name -> its name, lower-cased."""
    m = re.search(r"\b(h100|h200|h20|h800|gh200)\b", name.lower())
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def load_tables(results: Path = RESULTS) -> list[Table]:
    """Every table of every benchmark file under results/<op>/<card>/, ops in OPS order; a file on the wrong
    card's folder or a table measured in two files of one folder is an error (ValueError naming both)."""
    out: list[Table] = []
    for op in OPS:
        for folder in sorted(p for p in (results / op).glob("*") if p.is_dir()):
            seen: dict[str, Path] = {}
            for path in sorted(folder.glob(f"{op}_bench_*.json")):
                doc = json.loads(path.read_text())
                name = doc["environment"]["card"]["name"]
                if card_slug(name) != folder.name:
                    raise ValueError(f"{path.relative_to(results)}: measured on {name}, not a {folder.name}")
                only = f", cells {doc['cells_regex']}" if doc.get("cells_regex") else ""
                if not doc.get("complete", True):  # a stopped run's file holds the cells measured so far
                    only += f", stopped after {len(doc['cells'])} cells"
                for t in doc.get("tables") or sorted({r["table"] for r in doc["cells"]}):
                    rows = tuple(r for r in doc["cells"] if r["table"] == t)
                    if not rows:
                        continue
                    if t + only in seen:
                        raise ValueError(f"table {op} {t + only} on {folder.name} is in both {seen[t + only].name} "
                                         f"and {path.name}: a table is one process")
                    seen[t + only] = path
                    rel = RESULTS.relative_to(ROOT) / path.relative_to(results)
                    out.append(Table(op, folder.name, t + only, rows, doc, rel))
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(out, key=lambda t: (list(OPS).index(t.op), t.card, rank.get(t.name.split(",")[0], len(ORDER))))


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def speedups(t: Table, col: str) -> list[float]:
    return [r[f"speedup_{col}"] for r in t.rows if r.get(f"speedup_{col}")]


def wins(t: Table, col: str) -> str:
    s = speedups(t, col)
    return f"{sum(v >= 1.0 for v in s)}/{len(s)}"


def where(t: Table) -> str:
    """'NVIDIA H100 80GB HBM3, 2026-12-07, driver 580.95 (CUDA 13.0), torch 2.9.0'."""
    env = t.doc["environment"]
    smi = env["card"].get("smi") or {}
    driver = smi.get("driver_version") or "?"
    date = (t.doc.get("measured_at") or "")[:10] or "undated"
    return (f"{env['card']['name']} ({env['card']['sms']} SMs), {date}, driver {driver} "
            f"(CUDA {env.get('driver_cuda')}), torch {env.get('torch')}, triton {env.get('triton')}, "
            f"NVRTC {env.get('nvrtc')}")


def peers_line(t: Table) -> str:
    got = t.doc["environment"].get("peers") or {}
    return ", ".join(f"{d} {v or 'not installed'}" for d, v in sorted(got.items()))


def label(t: Table) -> str:
    return f"{OPS[t.op]} {t.name}"


def summary(tables: list[Table]) -> str:
    """The README's one table: per op, table and card, the geomean of the package's speedup over the best correct
    peer of each cell, by kernel time and by call time, and the cells at or above 1.00x."""
    lines = ["| op, table | card | cells | vs best peer, kernel time (cells ≥ 1.00x) | vs best peer, call time "
             "(cells ≥ 1.00x) | package wrong on |", "|---|---|---|---|---|---|"]
    for t in tables:
        wrong = [r["cell"] for r in t.rows if not r["correct"]]
        lines.append(f"| {label(t)} | {t.card.upper()} | {len(t.rows)} | {_x(geomean(speedups(t, 'kernel')))} "
                     f"({wins(t, 'kernel')}) | {_x(geomean(speedups(t, 'call')))} ({wins(t, 'call')}) | "
                     f"{len(wrong) or 'none'} |")
    return "\n".join(lines) + "\n"


def _pct(r: dict[str, Any]) -> str:
    p = r["sides"].get(PACKAGE, {}).get("pct_ceiling")
    return "–" if p is None else f"{p:.0f}%"


def _floor(f: dict[str, Any]) -> list[str]:
    """A row's floor ("134 (bytes)") and the share of it the package's kernel time reaches ("41%")."""
    if f.get("floor_us") is None:
        return ["–", "–"]
    return [f"{_us(f['floor_us'])} ({f['bound']})", "–" if f.get("share") is None else f"{100 * f['share']:.0f}%"]


def _not_timed(t: Table) -> list[str]:
    """Each peer that was not timed on some cell, with its status, reason and how many cells."""
    seen: dict[tuple[str, str, str], int] = {}
    for r in t.rows:
        for n, s in r["sides"].items():
            if s["status"] != "ok":
                key = (n, s["status"], ANSI.sub("", s.get("reason") or ""))
                seen[key] = seen.get(key, 0) + 1
    return [f"- {n}: {status} on {k}/{len(t.rows)} cells{f' ({why})' if why else ''}"
            for (n, status, why), k in sorted(seen.items())]


def short_labels(labels: list[str]) -> tuple[str, list[str]]:
    """What every label shares ("g=fp32,state=fp32,x=bf16 K128-V128") and each label without it ("B1-H32-T8192"):
    a label is "DTYPES DIM-DIM-..."."""
    parts = [(lab.split(" ", 1) + [""])[:2] for lab in labels]
    dts = {d for d, _ in parts}
    tokens = [dims.split("-") if dims else [] for _, dims in parts]
    common = [tok for tok in tokens[0] if all(tok in ts for ts in tokens)] if len(labels) > 1 else []
    shared = " ".join(x for x in (next(iter(dts)) if len(dts) == 1 and len(labels) > 1 else "", "-".join(common)) if x)
    short = [" ".join(x for x in (d if len(dts) > 1 else "", "-".join(tok for tok in ts if tok not in common)) if x)
             for (d, _), ts in zip(parts, tokens)]
    return shared, [x or lab for x, lab in zip(short, labels)]


def details_table(t: Table) -> str:
    doc = t.doc
    rel = t.path
    asked = []
    if not doc.get("complete", True):
        asked.append("the run was stopped before its last cell (its time limit)")
    ceiling = (doc.get("copy_ceiling") or {}).get("gbps")
    samples = f", {doc['samples']} samples per side and column" if doc.get("samples") else ""
    shared, labels = short_labels([r["cell"] for r in t.rows])
    floors = any("floor" in r for r in t.rows)  # KDA's rows: the longer of bytes at the ceiling and FLOPs at the rate
    # benches that time each call's host time: the package's beside torch eager's (the serving path's bar)
    hosts = any("host_us" in r["sides"].get(PACKAGE, {}) for r in t.rows)
    head = [f"### {label(t)}, {t.card.upper()}", "",
            f"{where(t)}. Peers: {peers_line(t)}. Copy ceiling {ceiling:.0f} GB/s." if ceiling else
            f"{where(t)}. Peers: {peers_line(t)}.",
            f"From [`{rel}`]({Path('..') / rel}){samples}"
            f"{'; ' + '; '.join(asked) if asked else ''}. Geomean over the cells: "
            f"{_x(geomean(speedups(t, 'kernel')))} by kernel time, {_x(geomean(speedups(t, 'call')))} by call time.",
            *([f"Every cell: `{shared}`."] if shared else []),
            "", "| cell | package path | package kernel µs | best peer (kernel) | × | package call µs | "
            "best peer (call) | × | % of copy ceiling |" + (" floor µs (bound) | share of floor |" if floors else "")
            + (" package host µs | torch eager host µs |" if hosts else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if floors else "") + ("---|---|" if hosts else "")]
    for r, short in zip(t.rows, labels):
        me = r["sides"].get(PACKAGE, {})
        cells = [short, r.get("path", "–")]
        for col in ("kernel", "call"):
            best = r.get(f"best_peer_{col}")
            peer_us = r["sides"][best][f"{col}_us"] if best else None
            cells += [_us(me.get(f"{col}_us")) if r["correct"] else f"**{me.get('status')}**",
                      f"{best} {_us(peer_us)}" if best else "–", _x(r.get(f"speedup_{col}"))]
        cells.append(_pct(r))
        if floors:
            cells += _floor(r.get("floor") or {})
        if hosts:
            cells += [_us(me.get("host_us")), _us(r["sides"].get("torch.eager", {}).get("host_us"))]
        head.append("| " + " | ".join(str(c) for c in cells) + " |")
    rest = _not_timed(t)
    if rest:
        head += ["", "Not timed:", *rest]
    return "\n".join(head) + "\n"


def details(tables: list[Table]) -> str:
    if not tables:
        return "No canonical benchmark is committed yet.\n"
    return "\n".join(details_table(t) for t in tables)


def render(tables: list[Table]) -> dict[str, str]:
    return {"summary": summary(tables), "details": details(tables)}


def replace_blocks(text: str, blocks: dict[str, str], where_: str) -> str:
    """text with each generated block's body replaced; a file without a block of that name is an error."""
    names = {m.group(2) for m in BLOCK.finditer(text)}
    missing = [n for n in blocks if n not in names]
    if missing:
        raise ValueError(f"{where_} has no <!-- results_tables:{missing[0]} --> block")
    return BLOCK.sub(lambda m: m.group(1) + blocks.get(m.group(2), m.group(3)) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed block differs; write nothing")
    args = ap.parse_args(argv)
    try:
        blocks = render(load_tables())
        stale = []
        for name, path in TARGETS.items():
            old = path.read_text()
            new = replace_blocks(old, {name: blocks[name]}, str(path.relative_to(ROOT)))
            if new != old:
                stale.append(str(path.relative_to(ROOT)))
                if not args.check:
                    path.write_text(new)
    except KeyError as e:
        print(f"results_tables: a benchmark file lacks the field {e}", file=sys.stderr)
        return 2
    except (ValueError, json.JSONDecodeError) as e:
        print(f"results_tables: {e}", file=sys.stderr)
        return 2
    if args.check:
        if stale:
            print(f"results_tables: {', '.join(stale)} differ from the result folders; run "
                  "python experiments/scripts/results_tables.py", file=sys.stderr)
            return 1
        print("results tables up to date")
        return 0
    print(f"wrote {', '.join(stale) or 'nothing (up to date)'}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

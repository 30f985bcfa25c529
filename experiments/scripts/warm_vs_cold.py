"""Does the lesson store make the next run better? Cold against warm, in replay of the H200 sweep or on the GPU.

Per seed: run A searches half of the shape matrix (N in {1024, 4096, 16384}, all dtypes and M) into
a fresh store. Run B searches the other half (N in {2048, 8192, 32768}) twice: cold (an empty
store) and warm (a copy of A's store: warm start from A's champions, A's parameter and template
priors, A's failure rules). Both B runs are the same `kfactory run` with the same seed; only the
store differs.

Reported per run: (genome, cell) evaluations until the best found is within 1% of the reference
best on every B cell (and on 90% of them), and the share of evaluations that were not OK (failures
and, in replay, UNKNOWN: points the sweep never measured), over the whole run and up to the target.
Rejections by failure memory cost no evaluation.

Reference best per B cell: in replay, the sweep's best. On the GPU (--gpu) timings carry noise, so
the reference is, per cell, the median over all B runs of the file of each run's final best (a lucky
low sample does not set a mark no run can reach); runs that never get within 1% count as missing.

Rerun: python experiments/scripts/warm_vs_cold.py --seeds 5
GPU:   python experiments/scripts/warm_vs_cold.py --gpu --first-seed 0 --seeds 3 --traces /tmp/t0.json, once
       per batch of seeds, then python experiments/scripts/warm_vs_cold.py --summarize /tmp/t*.json --out ...
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

import pandas as pd

from evo import load_config, run_config, Store

HALF_A = [1024, 4096, 16384]
HALF_B = [2048, 8192, 32768]
CHECKPOINTS = (90, 180, 360, 720)  # evaluation counts at which progress is compared at an equal budget
SWEEP = ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet"
REPLAY = {"config": ROOT / "experiments" / "rmsnorm_replay.toml", "max_evals": 3000}
# On the GPU: the GA experiment's space and timing, with a fixed small budget per run (no early stop)
GPU = {"config": ROOT / "experiments" / "rmsnorm_h200_ga.toml", "max_evals": 360, "generations": 100,
       "patience": 100, "max_seconds": 150}


def config_text(base: str, ns: list[int], seed: int, name: str, budget: dict[str, Any]) -> str:
    """The experiment with its cells narrowed to one half, its seed and name set, and budget keys replaced."""
    out, skip = [], False
    sets = {"seed": seed, "name": json.dumps(name), **{k: v for k, v in budget.items() if k != "config"}}
    if "replay_data" in base:
        sets["replay_data"] = json.dumps(str(SWEEP))
    for line in base.splitlines():
        if line.startswith("[cells]"):
            out += ["[cells]", "matrix = false", 'dtypes = ["bf16", "fp16", "fp32"]',
                    f"dims = {{ M = [4096, 32768], N = {ns} }}"]
            skip = True
            continue
        if skip and line.startswith("["):
            skip = False
        if skip:
            continue
        key = line.split("=")[0].strip()
        if "=" in line and key in sets:
            line = f"{key} = {sets[key]}"
        out.append(line)
    return "\n".join(out) + "\n"


def trace(store: Path, run_id: str) -> dict:
    """A run's evaluations in the order they were made (cell, status, median_us), and its rejections and seeds."""
    with Store.open(store, read_only=True) as s:
        ev = s.sql("SELECT cell, status, median_us FROM evaluations WHERE run_id = ? AND status != 'REJECTED' "
                   "ORDER BY generation, created_at, rowid", [run_id])
        rejected = int(s.sql("SELECT count(*) AS n FROM evaluations WHERE run_id = ? AND status = 'REJECTED'",
                             [run_id]).n[0])
        seeded = int(s.sql("SELECT count(*) AS n FROM lesson_uses WHERE run_id = ? AND effect = 'seeded'",
                           [run_id]).n[0])
    return {"cell": ev.cell.tolist(), "status": ev.status.tolist(),
            "median_us": [None if pd.isna(x) else float(x) for x in ev.median_us], "rejected": rejected,
            "seeded": seeded}


def measure(t: dict, best: dict[str, float]) -> dict:
    """Evaluations to within 1% of best on all (and 90% of) cells, and the share not OK, from a trace."""
    have: dict[str, float] = {}
    t_all = t_90 = None
    at: dict[str, dict[str, Any]] = {}
    for i, (cell, status, us) in enumerate(zip(t["cell"], t["status"], t["median_us"]), start=1):
        if status == "OK" and us is not None and us < have.get(cell, float("inf")):
            have[cell] = us
        within = sum(have.get(c, float("inf")) <= 1.01 * b for c, b in best.items())
        if t_90 is None and within >= 0.9 * len(best):
            t_90 = i
        if t_all is None and within == len(best):
            t_all = i
        if i in CHECKPOINTS:  # at an equal budget: cells within 1%, and the geomean of best found / reference
            gaps = [have[c] / b for c, b in best.items() if c in have]
            at[str(i)] = {"cells_within_1pct": within, "cells_found": len(gaps),
                          "geomean_best_over_reference": statistics.geometric_mean(gaps) if gaps else None}
    n = len(t["status"])
    head = t["status"][: t_all or n]
    wasted, wasted_head = sum(s != "OK" for s in t["status"]), sum(s != "OK" for s in head)
    return {"evaluations": n, "evals_all_cells_within_1pct": t_all, "evals_90pct_cells_within_1pct": t_90,
            "wasted_share": wasted / n if n else 0.0, "wasted_until_target": wasted_head,
            "wasted_share_until_target": wasted_head / len(head) if head else 0.0,
            "rejected": t["rejected"], "seeded": t["seeded"], "at_evals": at}


def run(config: Path, store: Path, run_id: str) -> None:
    code = run_config(load_config(config), store, run_id)
    if code != 0:
        raise SystemExit(f"run {run_id} exited {code}; stopping the experiment")


def run_seed(tmp: Path, seed: int, budget: dict[str, Any]) -> dict[str, dict]:
    """Run A, then B warm (on a copy of A's store) and B cold (empty store); their traces."""
    base = Path(budget["config"]).read_text()
    cfg_a, cfg_b = tmp / f"a{seed}.toml", tmp / f"b{seed}.toml"
    cfg_a.write_text(config_text(base, HALF_A, seed, "half-a", budget))
    cfg_b.write_text(config_text(base, HALF_B, seed, "half-b", budget))
    store_a = tmp / f"a{seed}" / "store.duckdb"
    run(cfg_a, store_a, f"A-{seed}")
    store_warm = tmp / f"warm{seed}" / "store.duckdb"
    store_warm.parent.mkdir(parents=True)
    shutil.copy(store_a, store_warm)
    run(cfg_b, store_warm, f"B-warm-{seed}")
    store_cold = tmp / f"cold{seed}" / "store.duckdb"
    run(cfg_b, store_cold, f"B-cold-{seed}")
    return {"warm": trace(store_warm, f"B-warm-{seed}"), "cold": trace(store_cold, f"B-cold-{seed}"),
            "run_a": trace(store_a, f"A-{seed}")}


def gpu_reference(traces: list[dict]) -> dict[str, float]:
    """Per cell, the median over the B runs of each run's final best time."""
    finals: dict[str, list[float]] = {}
    for row in traces:
        for kind in ("warm", "cold"):
            t = row[kind]
            best: dict[str, float] = {}
            for cell, status, us in zip(t["cell"], t["status"], t["median_us"]):
                if status == "OK" and us is not None:
                    best[cell] = min(us, best.get(cell, float("inf")))
            for cell, us in best.items():
                finals.setdefault(cell, []).append(us)
    return {cell: statistics.median(v) for cell, v in sorted(finals.items())}


def summarize(rows: list[dict], best: dict[str, float], reference: str, meta: dict) -> dict:
    runs = [{"seed": r["seed"], "cold": measure(r["cold"], best), "warm": measure(r["warm"], best)} for r in rows]

    def med(kind: str, key: str) -> Any:
        v = [r[kind][key] for r in runs if r[kind][key] is not None]
        return statistics.median(v) if v else None

    def reached(kind: str) -> int:
        return sum(r[kind]["evals_all_cells_within_1pct"] is not None for r in runs)

    summary: dict[str, Any] = {
        k: {"median_evals_all_cells_within_1pct": med(k, "evals_all_cells_within_1pct"),
            "median_evals_90pct_cells_within_1pct": med(k, "evals_90pct_cells_within_1pct"),
            "runs_reaching_target": reached(k),
            "median_wasted_share": med(k, "wasted_share"),
            "median_wasted_until_target": med(k, "wasted_until_target"),
            "median_wasted_share_until_target": med(k, "wasted_share_until_target")} for k in ("cold", "warm")}
    c, w = summary["cold"]["median_evals_all_cells_within_1pct"], summary["warm"]["median_evals_all_cells_within_1pct"]
    summary["warm_over_cold_evals"] = (w / c) if c and w else None
    def at(k: int, kind: str, key: str) -> Any:
        v = [r[kind]["at_evals"][str(k)][key] for r in runs if str(k) in r[kind]["at_evals"]]
        v = [x for x in v if x is not None]
        return statistics.median(v) if v else None

    reached_k = [k for k in CHECKPOINTS if all(str(k) in r[kind]["at_evals"] for r in runs for kind in ("cold", "warm"))]
    summary["median_cells_within_1pct_at_evals"] = {
        k: {kind: at(k, kind, "cells_within_1pct") for kind in ("cold", "warm")} for k in reached_k}
    summary["median_geomean_best_over_reference_at_evals"] = {
        k: {kind: at(k, kind, "geomean_best_over_reference") for kind in ("cold", "warm")} for k in reached_k}
    summary["warm_more_cells_within_1pct_at_evals"] = {
        k: {"warm_more": sum(r["warm"]["at_evals"][str(k)]["cells_within_1pct"]
                             > r["cold"]["at_evals"][str(k)]["cells_within_1pct"] for r in runs),
            "tied": sum(r["warm"]["at_evals"][str(k)]["cells_within_1pct"]
                        == r["cold"]["at_evals"][str(k)]["cells_within_1pct"] for r in runs)} for k in reached_k}
    summary["warm_fewer_evals_on_seeds"] = sum(
        (r["warm"]["evals_all_cells_within_1pct"] or 10**9) < (r["cold"]["evals_all_cells_within_1pct"] or 10**9)
        for r in runs)
    return {"what": __doc__.strip().splitlines()[0], "half_a_N": HALF_A, "half_b_N": HALF_B, "b_cells": len(best),
            "seeds": [r["seed"] for r in rows], "reference": reference, "reference_us": best, **meta,
            "summary": summary, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (to run the GPU seeds in batches)")
    ap.add_argument("--gpu", action="store_true", help="run on the GPU and write raw traces to --traces")
    ap.add_argument("--traces", type=Path, help="--gpu: where to write the raw traces (JSON)")
    ap.add_argument("--summarize", type=Path, nargs="+", help="GPU trace files to summarize into --out")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "warm_vs_cold_replay.json")
    args = ap.parse_args()
    if args.gpu and not args.traces:
        ap.error("--gpu needs --traces")
    if args.summarize:
        files = [json.loads(p.read_text()) for p in args.summarize]
        rows = sorted((r for f in files for r in f["rows"]), key=lambda r: r["seed"])
        meta = {"budget": files[0]["budget"], "fingerprint": files[0]["fingerprint"],
                "trace_files": [str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)
                                for p in args.summarize]}
        doc = summarize(rows, gpu_reference(rows), "median over B runs of each run's final best", meta)
    else:
        budget = GPU if args.gpu else REPLAY
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for seed in seeds:
                row = {"seed": seed, **run_seed(Path(tmp), seed, budget)}
                rows.append(row)
                if args.gpu:
                    with Store.open(Path(tmp) / f"cold{seed}" / "store.duckdb", read_only=True) as s:
                        fp = json.loads(s.sql("SELECT fingerprint_json FROM evaluations WHERE status = 'OK' "
                                              "LIMIT 1").fingerprint_json[0])
                    args.traces.parent.mkdir(parents=True, exist_ok=True)
                    shown = {k: str(Path(v).relative_to(ROOT)) if k == "config" else str(v) for k, v in budget.items()}
                    args.traces.write_text(json.dumps({"budget": shown,
                                                       "fingerprint": fp, "rows": rows}))
                print(f"seed {seed} done", flush=True)
        if args.gpu:
            return 0
        sweep = pd.read_parquet(SWEEP)
        ok = sweep[(sweep.status == "OK") & sweep.N.isin(HALF_B)]
        best = ok.groupby("cell").median_us.min().to_dict()
        doc = summarize(rows, best, "the sweep's best (experiments/data)", {})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

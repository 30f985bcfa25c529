"""Is a warm rerun faster than a cold run, and never worse? The replay experiment twice on one store.

Cold: `kfactory run experiments/rmsnorm_replay.toml` into a fresh store. Warm: the same command again
on the same store (a new run id, same config and seed). The warm run reuses the builds the store holds
(same build key: no NVRTC compile) and the results measured under the same fingerprint class (never
measured twice), and its dispatch table weighs those results too.

Recorded per run: wall seconds of the whole `kfactory run` process, the builds its evaluations used that it
compiled and that it reused from the store (the run's own summary, in its report's words), (genome, cell) evaluations
measured and reused (evaluations.reused_from), and per cell the best the store held before the warm
run against the warm run's dispatch table.

Rerun: python experiments/scripts/warm_rerun.py  (about two minutes on a 2-core machine)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from evo import Store

CONFIG = ROOT / "experiments" / "rmsnorm_replay.toml"
OUT = ROOT / "experiments" / "results" / "warm_rerun_replay.json"
_SUMMARY = re.compile(r"evaluations: \d+: (?P<measured>\d+) measured, (?P<reused>\d+) reused from earlier runs' "
                      r"measurements.*\nbuilds: \d+ used: (?P<compiled>\d+) compiled in this run, "
                      r"(?P<builds_reused>\d+) reused from the store")


def run(config: Path, store: Path, run_id: str) -> dict:
    """One `kfactory run` in a fresh process: its wall time and what its summary line says."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "evo.cli.main", "run", str(config), "--store", str(store), "--run-id", run_id],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"kfactory run {run_id} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    m = _SUMMARY.search(p.stdout)
    if m is None:
        raise SystemExit(f"no summary line in the output of run {run_id}:\n{p.stdout[-3000:]}")
    tail = [line.replace(str(store.parent), "<store dir>") for line in p.stdout.strip().splitlines()[-3:]]
    return {"wall_s": round(wall, 1), "compiles": int(m["compiled"]), "builds_reused": int(m["builds_reused"]),
            "log_tail": tail}


def store_facts(store: Path, run_id: str) -> dict:
    """What the store says about a run: evaluations measured and reused, builds it compiled first."""
    with Store.open(store, read_only=True) as s:
        e = s.sql("SELECT count(*) AS n, count(reused_from) AS reused, count(*) FILTER (WHERE status = 'OK') AS ok "
                  "FROM evaluations WHERE run_id = ?", [run_id]).iloc[0]
        b = s.sql("SELECT count(*) AS n FROM builds WHERE run_id = ?", [run_id]).n[0]
        r = s.sql("SELECT status, elapsed_s, message FROM runs WHERE run_id = ?", [run_id]).iloc[0]
    return {"evaluations": int(e.n), "evaluations_measured": int(e.n - e.reused), "evaluations_reused": int(e.reused),
            "evaluations_ok": int(e.ok), "builds_first_built_here": int(b), "status": r.status,
            "search_s": round(float(r.elapsed_s), 1), "stop": r.message}


def store_best(store: Path) -> dict[str, float]:
    """The fastest OK time per cell over every run in the store (one fingerprint class here: the sweep's)."""
    with Store.open(store, read_only=True) as s:
        df = s.sql("SELECT cell, min(median_us) AS us FROM evaluations WHERE status = 'OK' GROUP BY cell")
    return dict(zip(df.cell, df.us.astype(float)))


def dispatch(store: Path, run_id: str) -> dict[str, float]:
    table = json.loads((store.parent / "runs" / run_id / "dispatch.json").read_text())["dispatch"]
    return {cell: float(e["median_us"]) for cell, e in table.items()}


def compare(before: dict[str, float], after: dict[str, float]) -> dict:
    """Per cell: the store's best before the warm run and the warm run's dispatch time; cells worse after."""
    cells = sorted(set(before) | set(after))
    rows = {c: {"before_us": before.get(c), "after_us": after.get(c)} for c in cells}
    worse = [c for c in cells if c not in after or (c in before and after[c] > before[c])]
    better = [c for c in cells if c in before and c in after and after[c] < before[c]]
    return {"per_cell": rows, "cells": len(cells), "cells_worse_after": worse, "cells_better_after": better}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-warm-rerun-") as tmp:
        store = Path(tmp) / "store.duckdb"
        cold = run(args.config, store, "cold") | store_facts(store, "cold")
        before = store_best(store)
        cold_dispatch = dispatch(store, "cold")
        warm = run(args.config, store, "warm") | store_facts(store, "warm")
        after = dispatch(store, "warm")
    result = {
        "what": "experiments/rmsnorm_replay.toml run cold into a fresh store, then again (warm) on the same store",
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else str(args.config),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "cold": cold,
        "warm": warm,
        "warm_over_cold_wall": round(warm["wall_s"] / cold["wall_s"], 3),
        "warm_faster": warm["wall_s"] < cold["wall_s"],
        "cold_dispatch_equals_store_best": all(abs(cold_dispatch[c] - before[c]) < 1e-9 for c in before),
        "best_per_cell": compare(before, after),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"cold {cold['wall_s']} s ({cold['compiles']} compiles), warm {warm['wall_s']} s ({warm['compiles']} "
          f"compiles, {warm['evaluations_reused']} of {warm['evaluations']} evaluations reused); cells worse after: "
          f"{len(result['best_per_cell']['cells_worse_after'])}; wrote {args.out}")


if __name__ == "__main__":
    main()

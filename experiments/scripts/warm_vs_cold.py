"""Does the lesson store make the next run better? Cold against warm, in replay of the H200 sweep.

Per seed: run A searches half of the shape matrix (N in {1024, 4096, 16384}, all dtypes and M) into
a fresh store. Run B searches the other half (N in {2048, 8192, 32768}) twice: cold (an empty
store) and warm (a copy of A's store: warm start from A's champions, A's parameter priors, A's
failure rules). Both B runs are the same `kfactory run` with the same seed; only the store differs.

Reported per run: (genome, cell) evaluations until the best found is within 1% of the sweep's best
on every B cell (and on 90% of them), and the share of evaluations that were not OK (failures and
UNKNOWN: points the sweep never measured), over the whole run and up to the target. Rejections by
failure memory cost no evaluation.

Rerun: python experiments/scripts/warm_vs_cold.py --seeds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from evo.commands import cmd_run  # noqa: E402
from memory.store import Store  # noqa: E402

HALF_A = [1024, 4096, 16384]
HALF_B = [2048, 8192, 32768]


def config_text(base: str, ns: list[int], seed: int, name: str) -> str:
    """The replay experiment with its cells narrowed to one half and its seed set."""
    out, skip = [], False
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
        if line.startswith("seed ="):
            line = f"seed = {seed}"
        elif line.startswith("name ="):
            line = f'name = "{name}"'
        elif line.startswith("replay_data ="):
            line = f'replay_data = "{ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet"}"'
        elif line.startswith("max_evals ="):
            line = "max_evals = 3000"
        out.append(line)
    return "\n".join(out) + "\n"


def measure(store: Path, run_id: str, best: dict[str, float]) -> dict:
    with Store.open(store, read_only=True) as s:
        ev = s.sql("SELECT cell, status, median_us FROM evaluations WHERE run_id = ? AND status != 'REJECTED' "
                   "ORDER BY generation, created_at, rowid", [run_id])
        rejected = int(s.sql("SELECT count(*) AS n FROM evaluations WHERE run_id = ? AND status = 'REJECTED'",
                             [run_id]).n[0])
        seeded = int(s.sql("SELECT count(*) AS n FROM lesson_uses WHERE run_id = ? AND effect = 'seeded'",
                           [run_id]).n[0])
    have: dict[str, float] = {}
    t_all = t_90 = None
    for i, r in enumerate(ev.itertuples(index=False), start=1):
        if r.status == "OK" and r.median_us < have.get(r.cell, float("inf")):
            have[r.cell] = r.median_us
        within = sum(have.get(c, float("inf")) <= 1.01 * b for c, b in best.items())
        if t_90 is None and within >= 0.9 * len(best):
            t_90 = i
        if t_all is None and within == len(best):
            t_all = i
    head = ev.iloc[: t_all or len(ev)]
    return {"evaluations": len(ev), "evals_all_cells_within_1pct": t_all, "evals_90pct_cells_within_1pct": t_90,
            "wasted_share": float((ev.status != "OK").mean()) if len(ev) else 0.0,
            "wasted_until_target": int((head.status != "OK").sum()),
            "wasted_share_until_target": float((head.status != "OK").mean()) if len(head) else 0.0,
            "rejected": rejected, "seeded": seeded}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "warm_vs_cold_replay.json")
    args = ap.parse_args()
    base = (ROOT / "experiments" / "rmsnorm_replay.toml").read_text()
    sweep = pd.read_parquet(ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet")
    ok = sweep[(sweep.status == "OK") & sweep.N.isin(HALF_B)]
    best = ok.groupby("cell").median_us.min().to_dict()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for seed in range(args.seeds):
            cfg_a, cfg_b = t / f"a{seed}.toml", t / f"b{seed}.toml"
            cfg_a.write_text(config_text(base, HALF_A, seed, "half-a"))
            cfg_b.write_text(config_text(base, HALF_B, seed, "half-b"))
            store_a = t / f"a{seed}" / "store.duckdb"
            cmd_run(cfg_a, store_a, f"A-{seed}")
            store_warm = t / f"warm{seed}" / "store.duckdb"
            store_warm.parent.mkdir(parents=True)
            shutil.copy(store_a, store_warm)
            cmd_run(cfg_b, store_warm, f"B-warm-{seed}")
            store_cold = t / f"cold{seed}" / "store.duckdb"
            cmd_run(cfg_b, store_cold, f"B-cold-{seed}")
            row = {"seed": seed, "cold": measure(store_cold, f"B-cold-{seed}", best),
                   "warm": measure(store_warm, f"B-warm-{seed}", best)}
            runs.append(row)
            print(json.dumps(row), flush=True)

    def med(kind: str, key: str):
        v = [r[kind][key] for r in runs if r[kind][key] is not None]
        return statistics.median(v) if v else None

    summary = {k: {"median_evals_all_cells_within_1pct": med(k, "evals_all_cells_within_1pct"),
                   "median_evals_90pct_cells_within_1pct": med(k, "evals_90pct_cells_within_1pct"),
                   "median_wasted_share": med(k, "wasted_share"),
                   "median_wasted_until_target": med(k, "wasted_until_target"),
                   "median_wasted_share_until_target": med(k, "wasted_share_until_target")} for k in ("cold", "warm")}
    c, w = summary["cold"]["median_evals_all_cells_within_1pct"], summary["warm"]["median_evals_all_cells_within_1pct"]
    summary["warm_over_cold_evals"] = (w / c) if c and w else None
    doc = {"what": __doc__.strip().splitlines()[0], "half_a_N": HALF_A, "half_b_N": HALF_B, "b_cells": len(best),
           "seeds": args.seeds, "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

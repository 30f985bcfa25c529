"""Run the GA experiment on the GPU and export its evaluations and dispatch table (rerun on a GPU machine:
python experiments/scripts/ga_h200.py --out build/ga_h200)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from evo.cli.commands import run_config
from evo.core.config import load_config
from memory.store import Store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", type=Path, default=ROOT / "experiments" / "rmsnorm_h200_ga.toml")
    ap.add_argument("--store", type=Path, default=Path("/tmp/kf_ga/store.duckdb"))
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "ga_h200")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="the run's time budget in place of the config's budget.max_seconds (a shorter run on a "
                         "GPU paid by the minute: at least its seeded first generation)")
    args = ap.parse_args()
    config = load_config(args.config)
    if args.max_seconds is not None:  # the run records the budget it ran under (its config text), not the file's
        text, n = re.subn(r"(?m)^max_seconds\s*=.*$", f"max_seconds = {args.max_seconds:g}  # ga_h200.py --max-seconds",
                          config.source_text)
        if n != 1:
            text += f"\n# ga_h200.py --max-seconds {args.max_seconds:g} overrode budget.max_seconds\n"
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, max_seconds=args.max_seconds),
                                     source_text=text)
    run_config(config, args.store, "")
    args.out.mkdir(parents=True, exist_ok=True)
    with Store.open(args.store, read_only=True) as store:
        run_id = store.runs().run_id.iloc[-1]
        ev = store.sql("SELECT e.*, c.template, c.params_json FROM evaluations e JOIN candidates c USING (genome_key) "
                       "WHERE e.run_id = ?", [run_id])
        ev.to_parquet(args.out / "evaluations.parquet", index=False)
        builds = store.sql("SELECT status, count(*) AS n FROM builds WHERE run_id = ? GROUP BY 1", [run_id])
        fingerprint = json.loads(ev.fingerprint_json.dropna().iloc[0]) if ev.fingerprint_json.notna().any() else {}
    table = args.store.parent / "runs" / run_id / "dispatch.json"
    if not table.exists():  # stopped before its first generation was recorded: nothing to dispatch
        print(f"run {run_id} wrote no dispatch table; exported {len(ev)} evaluations only")
        return 1
    shutil.copy(table, args.out / "dispatch.json")
    dispatch = json.loads((args.out / "dispatch.json").read_text())
    picked = {(e["genome_key"], e["cell"]) for e in _entries(dispatch)}
    status_of = {(r.genome_key, r.cell): r.status for r in ev.itertuples()}
    (args.out / "summary.json").write_text(json.dumps({
        "run_id": run_id, "evaluations": len(ev), "fingerprint": fingerprint,
        "evaluations_by_status": ev.status.value_counts().to_dict(), "builds": builds.to_dict("records"),
        "dispatch_entries": len(picked),
        "dispatch_statuses": sorted({status_of.get(p, "missing") for p in picked}),
        "suspect_in_dispatch": sum(status_of.get(p) == "SUSPECT" for p in picked)}, indent=2))
    print(f"exported {len(ev)} evaluations of {run_id} to {args.out}")
    return 0


def _entries(dispatch: dict) -> list[dict]:
    """Dispatch entries as {genome_key, cell}."""
    return [dict(v, cell=k) for k, v in dispatch["dispatch"].items()]


if __name__ == "__main__":
    sys.exit(main())

"""Record (or check) the evaluations of a small seeded replay run, so a refactor can prove it changes
nothing: python experiments/scripts/replay_golden.py [--write] (run from any checkout: the run uses
the evo/ of the working directory)."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "data" / "replay_golden.json"
SWEEP = ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet"

CONFIG = """
[run]
op = "rmsnorm"
name = "golden"
templates = ["cta_row", "warp_row"]  # the templates it was recorded with: a new one changes what it searches
seed = 11
runner = "replay"
replay_data = "{sweep}"
[cells]
matrix = false
dtypes = ["bf16", "fp32"]
dims = {{ M = [4096, 32768], N = [1024, 8192, 32768] }}
[search]
population = 8
[budget]
max_evals = 3000
generations = 4
patience = 50
[build]
workers = 1
"""


def digest(cwd: Path) -> dict:
    """Run the config with the code in cwd; the evaluations as a count and a sha256."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "golden.toml"
        cfg.write_text(CONFIG.format(sweep=SWEEP))
        store = Path(tmp) / "s.duckdb"
        r = subprocess.run([sys.executable, "-m", "evo.cli.main", "run", str(cfg), "--store", str(store), "--run-id", "g"],
                           cwd=cwd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"replay run failed:\n{r.stderr[-2000:]}")
        code = ("import duckdb,sys; c=duckdb.connect(sys.argv[1], read_only=True); "
                "rows=c.execute(\"SELECT genome_key, cell, status, median_us, generation FROM evaluations "
                "WHERE run_id='g' ORDER BY generation, genome_key, cell\").fetchall(); "
                "print('\\n'.join('|'.join('' if v is None else (f'{v:.6f}' if isinstance(v, float) else str(v)) "
                "for v in r) for r in rows))")
        out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln]
    return {"evaluations": len(lines), "ok": sum("|OK|" in ln for ln in lines),
            "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="record the golden file instead of checking it")
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose evo/ runs (default: this one)")
    args = ap.parse_args()
    got = digest(args.code)
    print(json.dumps(got))
    if args.write:
        GOLDEN.write_text(json.dumps(got, indent=2) + "\n")
        return 0
    want = json.loads(GOLDEN.read_text())
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())

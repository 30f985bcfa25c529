"""Re-read every committed store's build logs with today's ptxas parser (evo.build.nvrtc.parse_ptxas) and list
the builds whose recorded resources differ: until 2026-12-04 a device function ptxas kept out of line could
overwrite its entry's spill and stack figures with its own (zeros), so a spilling kernel was recorded spill-free.

Run: python experiments/scripts/reparse_builds.py [OUT.json]   (reads experiments/**/*.duckdb read-only)
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import duckdb

from evo.build.nvrtc import parse_ptxas

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("spill_stores", "spill_loads", "stack_bytes", "regs")


def differing(store: Path) -> tuple[int, list[dict]]:
    """(builds with a log, those whose recorded maxima differ from the log's) of one store."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute("SELECT b.build_key, b.genome_key, b.status, b.spill_stores, b.spill_loads, b.stack_bytes, "
                           "b.regs, b.log, c.template, c.params_json FROM builds b LEFT JOIN candidates c "
                           "USING (genome_key) WHERE b.log IS NOT NULL AND b.log <> ''").fetchall()
    finally:
        con.close()
    out = []
    for key, genome, status, ss, sl, sb, regs, log, template, params in rows:
        res = parse_ptxas(log)
        if not res:
            continue
        now = {f: max(getattr(r, f) for r in res.values()) for f in FIELDS}
        was = dict(zip(FIELDS, (int(x or 0) for x in (ss, sl, sb, regs))))
        if now != was:
            out.append({"build_key": key, "genome_key": genome, "status": status, "template": template,
                        "params": json.loads(params) if params else None, "recorded": was, "reparsed": now,
                        "per_kernel": {k: {f: getattr(r, f) for f in FIELDS} for k, r in res.items()}})
    return len(rows), out


def main(argv: list[str]) -> int:
    report = {}
    for f in sorted(glob.glob(str(ROOT / "experiments/**/*.duckdb"), recursive=True)):
        n, diff = differing(Path(f))
        report[str(Path(f).relative_to(ROOT))] = {"builds_with_log": n, "differing": diff}
        print(f"{Path(f).relative_to(ROOT)}: {n} builds with a log, {len(diff)} differ")
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The run ids a package is exported from, read from a store: for each config's run name, its newest finished run.

    python experiments/scripts/newest_runs.py STORE NAME... prints the ids, space-separated

A NAME written "A|B" takes A's newest finished run where the store has one, else B's (a new search, else the
committed one). Run ids are NAME-YYYYMMDD-HHMMSS-xxxxxx, so "A" does not take a run of "A-best". A name without a
finished run prints nothing. Used by lab_gpu.sh's rmspackage and kdapackage stages.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import duckdb


def newest_runs(store: str, names: Sequence[str]) -> list[str]:
    c = duckdb.connect(store, read_only=True)
    try:
        def newest(name: str) -> str | None:
            q = "SELECT max(run_id) FROM runs WHERE run_id LIKE ? AND status = 'done'"
            return c.execute(q, [name + "-2%"]).fetchone()[0]

        out = []
        for alternatives in names:
            got = next((r for r in map(newest, alternatives.split("|")) if r), None)
            if got:
                out.append(got)
        return out
    finally:
        c.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        print("usage: newest_runs.py STORE NAME...", file=sys.stderr)
        return 2
    print(*newest_runs(argv[0], argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

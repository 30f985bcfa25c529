"""What `kfactory export` does: write the package (name: the given one, else the op family's) and say what
went into it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evo.export.make import export
from memory.store import Store


def cmd_export(runs: Sequence[str], store: Path, out: Path, name: str | None, nvrtc: Sequence[Path] = ()) -> int:
    from evo.cli.report import LATEST, resolve_run_id

    if LATEST in runs and store.exists():  # without a store, export says so itself
        with Store.open(store, read_only=True) as s:  # 'latest' means what it means to `kfactory report`
            runs = [resolve_run_id(s, r) if r == LATEST else r for r in runs]
    done = export(store, runs, out, name, nvrtc=nvrtc)
    for op, run_id, cells, kernels in done.ops:
        print(f"{op}: run {run_id}, {cells} cells, {kernels} kernels")
    print(f"wrote package {done.name} to {done.out}; install it with: pip install {done.out}")
    return 0

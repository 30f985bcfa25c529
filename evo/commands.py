"""What `kfactory run` and `kfactory sql` do (the CLI module only parses arguments)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evo.config import Backend, Config, Runner, load_config, parse_config
from evo.pipeline import NoGpuError, Session, new_run_id, run_build_stage
from memory.store import Store, StoreError


def cmd_resume(run_id: str, store_path: Path) -> int:
    """Continue a run from what its store holds (after a crash or kill -9); nothing is re-evaluated."""
    if not store_path.exists():
        raise StoreError(f"no store at {store_path}")
    with Store.open(store_path, read_only=True) as store:
        df = store.sql("SELECT config_toml FROM runs WHERE run_id = ?", [run_id])
        known = store.runs().run_id.tolist()
    if df.empty:
        raise StoreError(f"no run {run_id!r} in {store_path}; known runs: {', '.join(known) or 'none'}")
    return _run(parse_config(df.config_toml[0], f"run {run_id}"), store_path, run_id)


def cmd_run(config_path: Path, store_path: Path, run_id: str = "") -> int:
    return _run(load_config(config_path), store_path, run_id)


def _run(config: Config, store_path: Path, run_id: str) -> int:
    with Store.open(store_path) as store:
        session = Session(config, store, run_id or new_run_id(config))
        session.record_run()
        print(f"run {session.run_id}: op {config.run.op}, arch {config.run.arch}, {len(session.cells)} cells, "
              f"templates {', '.join(session.templates)}; store {store_path}")
        if config.run.runner is Runner.GPU:
            from evo.run import gpu_available

            if config.run.backend is Backend.LOCAL and not gpu_available():
                run_build_stage(session)
                store.finish_run(session.run_id, "stopped", "no NVIDIA GPU: built only")
                raise NoGpuError(
                    "evaluation needs an NVIDIA GPU and none is visible (no driver or no device); the builds "
                    f"are recorded in {store_path}. Run on a GPU machine, or use a replay config "
                    "(run.runner = 'replay') to search against recorded measurements.")
            from evo.search import run_search

            return run_search(session)
        if config.run.runner is Runner.REPLAY:
            from evo.search import run_search

            return run_search(session)
        run_build_stage(session)
        store.finish_run(session.run_id, "done", "built only (run.runner = 'none')")
        return 0


def cmd_sql(query: str, store_path: Path) -> int:
    if not store_path.exists():
        raise StoreError(f"no store at {store_path} (run an experiment first, or pass --store PATH)")
    with Store.open(store_path, read_only=True) as store:
        df = store.sql(query)
    with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 200,
                           "display.max_colwidth", 60):
        print(df.to_string(index=False) if not df.empty else "(no rows)")
    return 0


def cmd_lessons(store_path: Path, op: str, arch: str, kind: str | None, limit: int) -> int:
    from memory.queries import lessons_table

    if not store_path.exists():
        raise StoreError(f"no store at {store_path}")
    with Store.open(store_path, read_only=True) as store:
        df = lessons_table(store, op, arch, kind)
    if df.empty:
        print(f"(no lessons for op {op}, arch {arch}{', kind ' + kind if kind else ''})")
        return 0
    cols = [c for c in ("kind", "scope", "text", "support", "usefulness") if c in df.columns]
    with pd.option_context("display.max_colwidth", 110, "display.width", 250):
        print(df[cols].head(limit).to_string(index=False))
    if len(df) > limit:
        print(f"... {len(df) - limit} more (--limit)")
    return 0

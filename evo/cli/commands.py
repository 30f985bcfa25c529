"""What `kfactory run`, `resume`, `sql` and `lessons` do (the CLI module only parses arguments)."""

from __future__ import annotations

import shutil
import signal
import sys
import textwrap
import threading
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from evo.core.config import Backend, Config, Runner, load_config, parse_config, with_max_seconds
from evo.core.extras import check_extras
from evo.loop.build_summary import built_only_message
from evo.loop.pipeline import NoGpuError, Session, new_run_id, run_build_stage
from memory.runs import run_ids, stored_config
from memory.store import Store, StoreError, user_query

COMPILE_ONLY = "compile only (run.runner = 'compile'): built, nothing evaluated"
LESSONS_WIDTH = 100  # `kfactory lessons` wraps to the terminal, at most this wide


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached a run: it stops, its children end, and it is recorded as interrupted."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def interruptible() -> Iterator[list[int]]:
    """Turn SIGINT and SIGTERM into Interrupted in the main thread; after the first, ignore both, so the
    unwinding that ends the compile processes and GPU workers is not cut short by a second Ctrl-C.

    Yields the signals caught: a library may turn the Interrupted raised in its code into its own
    error (DuckDB does: 'Query interrupted'), so any error after a signal counts as the interrupt."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        caught.append(signum)
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cmd_resume(run_id: str, store_path: Path) -> int:
    """Continue a run from what its store holds (after a crash, kill or Ctrl-C) with its stored config."""
    if not store_path.exists():
        raise StoreError(f"no store at {store_path}")
    with Store.open(store_path, read_only=True) as store:
        stored = stored_config(store, run_id)
        known = run_ids(store)
    if stored is None:
        raise StoreError(f"no run {run_id!r} in {store_path}; known runs: {', '.join(known) or 'none'}")
    return run_config(parse_config(stored.toml, f"run {run_id}", stored.path), store_path, run_id)


def cmd_run(config_path: Path, store_path: Path, run_id: str = "", max_seconds: float | None = None) -> int:
    config = load_config(config_path)
    return run_config(config if max_seconds is None else with_max_seconds(config, max_seconds), store_path, run_id)


def run_config(config: Config, store_path: Path, run_id: str) -> int:
    """Run a loaded config."""
    from evo.cli.errors import DEFAULT_STORE

    check_extras(config)  # before the store is opened: a refused run leaves no file
    created = _missing_parts(store_path)
    started = False
    try:
        with Store.open(store_path) as store, interruptible() as caught:
            session = Session(config, store, run_id or new_run_id(config))
            evaluator = None
            if config.run.runner is Runner.REPLAY:
                from evo.loop.search import replay_evaluator

                evaluator = replay_evaluator(session)  # refuses data that does not cover the cells
            session.record_run()  # refuses a run id started under another config
            started = True
            try:
                store.write_snapshot()
                return _execute(session, store_path, evaluator)
            except BaseException as e:
                if caught or isinstance(e, Interrupted):
                    name = signal.Signals(caught[0]).name if caught else str(e)
                    store.finish_run(session.run_id, "interrupted", f"stopped by {name}")
                    store.write_snapshot()
                    where = "" if store_path == DEFAULT_STORE else f" --store {store_path}"
                    print(f"kfactory run: {name}: run {session.run_id} stopped and recorded as interrupted; "
                          f"continue it with: kfactory resume {session.run_id}{where}", file=sys.stderr)
                    return 128 + (caught[0] if caught else signal.SIGINT)
                if not isinstance(e, NoGpuError):  # that one is recorded as stopped, with its builds
                    # a user error or a bug: the run must not stay 'running'
                    store.finish_run(session.run_id, "failed", f"{type(e).__name__}: {e}"[:2000])
                    store.write_snapshot()
                raise
    finally:
        if not started:  # refused before it started: a store this call created would stay empty, so it goes
            _remove_created(store_path, created)


def _missing_parts(store_path: Path) -> list[Path]:
    """What opening a store at store_path creates: the file, then the folders it needs that are missing."""
    if store_path.exists():
        return []
    missing = [store_path]
    for folder in store_path.absolute().parents:
        if folder.exists():
            break
        missing.append(folder)
    return missing


def _remove_created(store_path: Path, created: list[Path]) -> None:
    """Remove what _missing_parts listed: the store file, its WAL, and its new folders while they are empty."""
    if not created:
        return
    store_path.unlink(missing_ok=True)
    Path(f"{store_path}.wal").unlink(missing_ok=True)
    for folder in created[1:]:
        try:
            folder.rmdir()
        except OSError:  # not empty: something else was put there meanwhile
            return


def _execute(session: Session, store_path: Path, evaluator: Any) -> int:
    config, store = session.config, session.store
    print(f"run {session.run_id}: op {config.run.op}, arch {config.run.arch}, {len(session.cells)} cells, "
          f"templates {', '.join(session.templates)}; store {store_path}")
    if config.run.runner is Runner.GPU:
        from evo.measure.run import gpu_available

        if config.run.backend is Backend.LOCAL and not gpu_available():
            built = run_build_stage(session)
            store.finish_run(session.run_id, "stopped", built_only_message("no NVIDIA GPU: built only", built))
            # replay is not offered: it needs measurements recorded on a GPU for this op and space
            raise NoGpuError(
                "evaluation needs an NVIDIA GPU and none is visible (no driver or no device); the builds "
                f"are recorded in {store_path}. Without a GPU, set run.runner = \"compile\" to render and "
                "compile only (build errors summed up per template); or run on a GPU machine.")
    if config.run.runner in (Runner.GPU, Runner.REPLAY):
        from evo.loop.search import run_search

        return run_search(session, evaluator)
    summary = run_build_stage(session)
    summary.check()  # nothing built OK: an error, and run_config records the run as failed (its builds are kept)
    store.finish_run(session.run_id, "done", built_only_message(COMPILE_ONLY, summary))
    return 0


def open_reader(store_path: Path) -> Store:
    """The store for reading; while a run holds it, its snapshot (said on stderr)."""
    if not store_path.exists():
        raise StoreError(f"no store at {store_path} (run an experiment first, or pass --store PATH)")
    store = Store.open(store_path, read_only=True)
    if store.snapshot is not None:
        when = datetime.fromtimestamp(store.snapshot.stat().st_mtime).strftime("%H:%M:%S")
        print(f"(a run is writing {store_path}: reading its snapshot of {when})", file=sys.stderr)
    return store


def cmd_sql(query: str, store_path: Path) -> int:
    if not query.strip():
        raise StoreError('empty query: pass a SQL statement, e.g. kfactory sql "SELECT * FROM runs"')
    with open_reader(store_path) as store:
        df = user_query(store, query)
    with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 200,
                           "display.max_colwidth", 60):
        print(df.to_string(index=False) if not df.empty else "(no rows)")
    return 0


def format_lessons(df: pd.DataFrame, width: int) -> list[str]:
    """One block per lesson: kind, scope and numbers on the first line, the text wrapped and indented below."""
    lines = []
    for r in df.itertuples(index=False):
        head = f"{r.kind} | {r.scope} | usefulness {float(r.usefulness):+.2f}, support {int(r.support)}"
        lines += textwrap.wrap(head, width, subsequent_indent="    ") or [""]
        lines += textwrap.wrap(str(r.text), width, initial_indent="    ", subsequent_indent="    ")
    return lines


def cmd_lessons(store_path: Path, op: str, arch: str, kind: str | None, limit: int) -> int:
    from memory.queries import lessons_table
    from evo.core.registry import get_op

    get_op(op)  # an unknown op is the user's error (UnknownOpError, exit 2), not an empty list of lessons
    with open_reader(store_path) as store:
        df = lessons_table(store, op, arch, kind)
    if df.empty:
        print(f"(no lessons for op {op}, arch {arch}{', kind ' + kind if kind else ''})")
        return 0
    width = max(40, min(LESSONS_WIDTH, shutil.get_terminal_size((LESSONS_WIDTH, 24)).columns))
    print("\n".join(format_lessons(df.head(limit), width)))
    if len(df) > limit:
        print(f"... {len(df) - limit} more (not significant last; else most useful, largest effect, best supported "
              "first; --limit N shows more)")
    return 0

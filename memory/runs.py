"""A run's row read back: the run ids, the row itself, the config it ran under, and its progress counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd

from memory.store import Store


@dataclass(frozen=True)
class StoredConfig:
    """The config a run was started with, as its row holds it."""

    toml: str
    hash: str
    path: str  # absolute path of the config file; "" for a config given as text


def run_ids(store: Store) -> list[str]:
    """Every run id, oldest first (ties by id)."""
    return store.sql("SELECT run_id FROM runs ORDER BY created_at, run_id").run_id.tolist()


def run_row(store: Store, run_id: str) -> pd.Series | None:
    """The run's row (every column of runs), or None for an unknown run."""
    df = store.sql("SELECT * FROM runs WHERE run_id = ?", [run_id])
    return None if df.empty else df.iloc[0]


def stored_config(store: Store, run_id: str) -> StoredConfig | None:
    """The config text, hash and path the run was started with, or None for an unknown run."""
    df = store.sql("SELECT config_toml, config_hash, config_path FROM runs WHERE run_id = ?", [run_id])
    if df.empty:
        return None
    path = df.config_path[0]
    return StoredConfig(df.config_toml[0], df.config_hash[0], path if isinstance(path, str) else "")


def elapsed_s(store: Store, run_id: str) -> float | None:
    """Search time the run has spent so far (summed over resumes), or None when none is recorded."""
    df = store.sql("SELECT elapsed_s FROM runs WHERE run_id = ?", [run_id])
    return None if df.empty or pd.isna(df.elapsed_s[0]) else float(df.elapsed_s[0])


def next_generation(store: Store, run_id: str) -> int:
    """The generation after the run's last recorded one (0 for a run with no evaluation)."""
    return int(store.sql("SELECT coalesce(max(generation), -1) + 1 AS g FROM evaluations WHERE run_id = ?",
                         [run_id]).g[0])


def reused_count(store: Store, run_id: str) -> int:
    """How many of the run's evaluations were copied from an earlier run's measurement."""
    return int(store.sql("SELECT count(reused_from) AS n FROM evaluations WHERE run_id = ?", [run_id]).n[0])


def status_counts(store: Store, table: Literal["evaluations", "builds"], run_id: str) -> pd.DataFrame:
    """(status, n) of the run's evaluations or builds (builds: those it built first), most first, then by name."""
    if table not in ("evaluations", "builds"):
        raise ValueError(f"status counts are of evaluations or builds, not {table!r}")
    return store.sql(f"SELECT status, count(*) AS n FROM {table} WHERE run_id = ? "
                     "GROUP BY status ORDER BY n DESC, status", [run_id])

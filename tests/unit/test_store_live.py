"""The store's schema check and migration, bulk writes, and readers while another process writes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from memory import SCHEMA_VERSION, SchemaVersionError, Store, StoreError
from memory.schema import MIGRATIONS
from memory.store import snapshot_path
from tests.unit.test_store import build_row, evaluation_row, lesson_row, run_row

REPO = Path(__file__).resolve().parents[2]


def _version_1(path: Path) -> None:
    """Turn a fresh store into what version 1 wrote: the same tables without the columns version 2 added."""
    with duckdb.connect(str(path)) as conn:
        for stmt in MIGRATIONS[1]:
            if stmt.startswith("ALTER TABLE"):
                _, _, t, _, _, col, _ = stmt.split()
                conn.execute(f"ALTER TABLE {t} DROP COLUMN {col}")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")


def test_an_older_store_is_migrated_in_place(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == 2
    path = tmp_path / "old.duckdb"
    with Store.open(path) as s:
        s.write([run_row("r1"), run_row("r2"), evaluation_row("e1", error="reused from run r1", reused_from=None),
                 evaluation_row("e2", error=None, reused_from=None)])
    _version_1(path)
    with pytest.raises(StoreError, match="missing"):  # a version-1 file is not a version-2 one
        with duckdb.connect(str(path)) as conn:
            conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        Store.open(path)
    with duckdb.connect(str(path)) as conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with Store.open(path, read_only=True) as s:  # a reader upgrades it too (the migration only adds columns)
        assert s.sql("SELECT value FROM meta").value[0] == str(SCHEMA_VERSION)
        ev = s.sql("SELECT eval_id, reused_from FROM evaluations ORDER BY eval_id")
        assert ev.reused_from.tolist()[0] == "r1" and ev.reused_from.isna().tolist() == [False, True]
        assert s.sql("SELECT count(*) AS n FROM runs WHERE elapsed_s IS NULL").n[0] == 2
    with Store.open(path) as s:  # and it is now an ordinary current store
        s.write([run_row("r3")])


def test_columns_are_checked_not_only_the_version(tmp_path: Path) -> None:
    path = tmp_path / "odd.duckdb"
    Store.open(path).close()
    with duckdb.connect(str(path)) as conn:
        conn.execute("ALTER TABLE builds DROP COLUMN cubin")
        conn.execute("ALTER TABLE builds ADD COLUMN cubin_zstd BLOB")
    with pytest.raises(StoreError) as e:
        Store.open(path, read_only=True)
    msg = str(e.value)
    assert str(path) in msg and "table builds" in msg and "version 2" in msg
    assert "missing ['cubin BLOB']" in msg and "unexpected ['cubin_zstd BLOB']" in msg
    assert "\n" not in msg


def test_a_newer_store_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    Store.open(path).close()
    with duckdb.connect(str(path)) as conn:
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    for ro in (False, True):
        with pytest.raises(SchemaVersionError, match="version 3.*expects version 2.*newer"):
            Store.open(path, read_only=ro)


@pytest.mark.parametrize("n", [5, 200], ids=["row-by-row", "bulk"])
def test_conflict_policies_hold_for_small_and_bulk_batches(tmp_path: Path, n: int) -> None:
    with Store.open(tmp_path / "s.duckdb") as s:
        s.write([build_row(f"b{i % (n // 2)}", regs=i, cubin=bytes([i % 256]) * 3) for i in range(n)])
        builds = s.sql("SELECT build_key, regs, cubin FROM builds ORDER BY regs")
        assert len(builds) == n // 2 and builds.regs.tolist() == list(range(n // 2))  # first writer wins
        assert bytes(builds.cubin[1]) == b"\x01\x01\x01"
        s.write([lesson_row(f"l{i % 3}", usefulness=float(i)) for i in range(n)])
        assert sorted(s.sql("SELECT usefulness FROM lessons").usefulness) == [float(n - 3), float(n - 2), float(n - 1)]
        with pytest.raises(StoreError, match="evaluations"):
            s.write([evaluation_row(f"e{i % (n - 1)}") for i in range(n)])
        assert s.sql("SELECT count(*) AS n FROM evaluations").n[0] == 0  # the batch rolled back whole
        s.write([evaluation_row(f"e{i}", median_us=None, samples=None, created_at=None) for i in range(n)])
        got = s.sql("SELECT count(*) AS n, count(median_us) AS m, min(created_at) IS NOT NULL AS t FROM evaluations")
        assert (got.n[0], got.m[0], bool(got.t[0])) == (n, 0, True)


_WRITER = """
import sys, time
from memory import Store
from tests.unit.test_store import run_row
with Store.open(sys.argv[1]) as s:
    s.write([run_row("live")])
    if sys.argv[2] == "snapshot":
        s.write_snapshot()
    s.write([run_row("after-snapshot")])
    print("holding", flush=True)
    time.sleep(60)
"""


def _hold(path: Path, mode: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), mode], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return p


def test_readers_read_the_snapshot_while_a_writer_holds_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    writer = _hold(path, "snapshot")
    try:
        with Store.open(path, read_only=True) as s:
            assert s.snapshot == snapshot_path(path) and s.path == path
            assert s.sql("SELECT run_id FROM runs").run_id.tolist() == ["live"]  # as of the snapshot
            with pytest.raises(StoreError, match="read-only"):
                s.write([run_row("x")])
        with pytest.raises(StoreError, match="another process has the store open") as e:
            Store.open(path)
        assert "\n" not in str(e.value)
    finally:
        writer.kill()
        writer.wait()
    with Store.open(path, read_only=True) as s:  # the writer is gone: the file itself again
        assert s.snapshot is None and len(s.runs()) == 2


def test_a_reader_without_a_snapshot_gets_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    writer = _hold(path, "none")
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="a run is writing the store and has not written its snapshot"):
            Store.open(path, read_only=True)
        assert time.monotonic() - t0 < 10
    finally:
        writer.kill()
        writer.wait()

"""DuckDB implementation of the lesson store: open with a schema check, batched writes, SQL reads.

Only one process may write a store file: DuckDB takes a file lock, so a second writer fails in
Store.open, and so would a reader while a writer holds the file. Readers during a run read a
snapshot instead: the writer copies the store to `<name>.snapshot.duckdb` beside it (after a
checkpoint, so the copy is a consistent database) whenever it calls `write_snapshot()` (the search does
at its start and after every generation), and `Store.open(path, read_only=True)` falls back to that
copy when the file itself is locked. In Kernel Factory the parent process alone writes; GPU workers
return records to it. A Store holds one connection and is not thread-safe.
"""

import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from memory.rows import ROW_TYPES, BuildRow, Row
from memory.schema import (
    META,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    OnConflict,
    Table,
    ddl,
    table,
)

# Columns the store stamps with the current time when a row leaves them None.
_STAMPED = ("created_at", "updated_at")


class StoreError(Exception):
    """The store file cannot be used, or a write broke a store rule."""


class SchemaVersionError(StoreError):
    """The store file was written with a different schema version."""

    def __init__(self, path: Path, found: str, expected: int, hint: str = "") -> None:
        super().__init__(f"{path}: lesson store schema version {found}, this code expects version {expected}"
                         + (f"; {hint}" if hint else ""))
        self.path = path
        self.found = found
        self.expected = expected


# DuckDB's names for the types the schema declares
_DUCK_TYPES = {"TEXT": "VARCHAR"}
_ARROW_TYPES = {"TEXT": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(),
                "TIMESTAMP": pa.timestamp("us"), "BLOB": pa.binary(), "BOOLEAN": pa.bool_()}
_BULK_ROWS = 32  # groups at least this large go in through Arrow (DuckDB's executemany is slow per row)


def snapshot_path(path: str | Path) -> Path:
    """Where the writer of `path` keeps the snapshot that readers use while it runs."""
    p = Path(path)
    return p.with_name(p.stem + ".snapshot" + p.suffix)


def _is_lock_error(e: duckdb.Error) -> bool:
    # DuckDB has no error code for this; its IOException text is the only way to tell a held lock apart
    return isinstance(e, duckdb.IOException) and "lock" in str(e).lower()


class _Locked(Exception):
    """Another process holds the store file's lock."""


def _utcnow() -> datetime:
    """Current UTC time, naive, as DuckDB TIMESTAMP stores it."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _insert_sql(t: Table) -> str:
    """Parameterized INSERT for t, carrying its conflict policy."""
    cols = ", ".join(t.column_names)
    marks = ", ".join("?" for _ in t.columns)
    sql = f"INSERT INTO {t.name} ({cols}) VALUES ({marks})"
    if t.on_conflict is OnConflict.IGNORE:
        return sql + " ON CONFLICT DO NOTHING"
    if t.on_conflict is OnConflict.UPSERT:
        updated = [c for c in t.column_names if c != t.key and c not in t.keep_on_update]
        return sql + f" ON CONFLICT ({t.key}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in updated)
    return sql


class Batch:
    """Rows written inside one transaction; obtained from Store.batch()."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path) -> None:
        self._conn = conn
        self._path = path
        self._open = True

    def add(self, row: Row) -> None:
        """Write one row to the table its type maps to."""
        self.add_all([row])

    def add_all(self, rows: Iterable[Row]) -> None:
        """Write rows, grouped by type; order within a type is kept (first writer wins, last upsert wins)."""
        if not self._open:
            raise StoreError(f"{self._path}: batch already closed")
        by_type: dict[type, list[Row]] = {}
        for row in rows:
            if type(row) not in ROW_TYPES:
                raise TypeError(f"not a store row: {type(row).__name__}")
            by_type.setdefault(type(row), []).append(row)
        now = _utcnow()
        for row_type, group in by_type.items():
            t = table(row_type.TABLE)
            values = [
                [now if c in _STAMPED and getattr(r, c) is None else getattr(r, c) for c in t.column_names]
                for r in group
            ]
            try:
                if len(values) >= _BULK_ROWS:
                    self._insert_arrow(t, values)
                else:
                    self._conn.executemany(_insert_sql(t), values)
            except duckdb.ConstraintException as e:
                raise StoreError(f"{self._path}: {t.name}: {e}") from e

    def record_elapsed(self, run_id: str, seconds: float) -> None:
        """Record how much of its time budget a run has spent, with the batch's rows."""
        if not self._open:
            raise StoreError(f"{self._path}: batch already closed")
        self._conn.execute("UPDATE runs SET elapsed_s = ? WHERE run_id = ?", [seconds, run_id])

    def _insert_arrow(self, t: Table, values: list[list[Any]]) -> None:
        """One INSERT ... SELECT over an Arrow table, with the same conflict semantics as row by row."""
        if t.key is not None and t.on_conflict is not OnConflict.ERROR:
            k = t.column_names.index(t.key)
            keep: dict[Any, list[Any]] = {}
            for v in values:  # IGNORE: the first row of a key wins; UPSERT: the last
                if t.on_conflict is OnConflict.UPSERT or v[k] not in keep:
                    keep[v[k]] = v
            values = list(keep.values())
        cols = list(zip(*values))
        data = pa.table({name: pa.array(col, type=_ARROW_TYPES[sql_type])
                         for (name, sql_type), col in zip(t.columns, cols)})
        names = ", ".join(t.column_names)
        self._conn.register("kf_bulk_rows", data)  # a later batch re-registers the name if this one fails
        self._conn.execute(_insert_sql(t).replace(f"VALUES ({', '.join('?' for _ in t.columns)})",
                                                  f"SELECT {names} FROM kf_bulk_rows"))
        self._conn.unregister("kf_bulk_rows")


class Store:
    """A lesson store file; open with Store.open(path), use as a context manager or close()."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path, read_only: bool,
                 snapshot: Path | None = None) -> None:
        self._conn = conn
        self.path = path
        self.read_only = read_only
        self.snapshot = snapshot  # the snapshot file read instead of path, which its writer holds
        self._in_batch = False

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> "Store":
        """Open or create the store at path; check its schema (upgrading an older one in place).

        Read-only, a store locked by its writer is read through the snapshot the writer keeps."""
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"{path}: no such lesson store")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return cls._connect(path, read_only)
        except SchemaVersionError as e:
            if not read_only or not e.found.isdigit() or int(e.found) > SCHEMA_VERSION:
                raise
            try:
                cls._connect(path, read_only=False).close()  # an older store: upgraded by its first writable open
            except _Locked:
                raise SchemaVersionError(path, e.found, SCHEMA_VERSION, "it cannot be upgraded while another "
                                         "process has it open") from None
            return cls._connect(path, read_only)
        except _Locked as e:
            snap = snapshot_path(path)
            if not read_only:
                raise StoreError(f"{path}: another process has the store open ({e}); only one process may "
                                 "write it, and none may hold it while it does (close a notebook or other "
                                 "reader of it, or wait for the run that writes it)") from None
            if not snap.exists():
                raise StoreError(f"{path}: a run is writing the store and has not written its snapshot "
                                 f"({snap.name}) yet; try again in a moment") from None
            return cls._connect(snap, read_only=True, snapshot_of=path)

    @classmethod
    def _connect(cls, path: Path, read_only: bool, snapshot_of: Path | None = None) -> "Store":
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as e:
            if _is_lock_error(e):
                raise _Locked(str(e).split("\n")[0]) from None
            raise StoreError(f"{path}: cannot open as a DuckDB database: {e}") from e
        store = cls(conn, snapshot_of or path, read_only, snapshot=path if snapshot_of else None)
        try:
            store._init_or_check()
        except BaseException:
            conn.close()
            raise
        return store

    def _init_or_check(self) -> None:
        """Create the schema in an empty database, else check its version and columns (migrating an older one)."""
        found_tables = self._conn.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchall()
        tables = {r[0] for r in found_tables}
        if not tables:
            if self.read_only:
                raise StoreError(f"{self.path}: empty database, not a lesson store")
            with self._transaction():
                for stmt in ddl():
                    self._conn.execute(stmt)
                self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            return
        if "meta" not in tables:
            raise StoreError(f"{self.path}: DuckDB database without a meta table, not a lesson store")
        found = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if found is None:
            raise StoreError(f"{self.path}: meta table has no schema_version")
        if found[0] != str(SCHEMA_VERSION):
            if not (found[0].isdigit() and int(found[0]) < SCHEMA_VERSION) or self.read_only:
                hint = "" if found[0].isdigit() and int(found[0]) < SCHEMA_VERSION else \
                    "it was written by a newer Kernel Factory"
                raise SchemaVersionError(self.path, found[0], SCHEMA_VERSION, hint)
            self._migrate(int(found[0]))
        self._check_columns()

    def _migrate(self, version: int) -> None:
        """Upgrade a store written with an older schema, one version at a time, in one transaction."""
        if any(v not in MIGRATIONS for v in range(version, SCHEMA_VERSION)):
            raise SchemaVersionError(self.path, str(version), SCHEMA_VERSION, "no migration path from it")
        self._check_columns(version)
        with self._transaction():
            for v in range(version, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v]:
                    self._conn.execute(stmt)
            self._conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])

    def _check_columns(self, version: int = SCHEMA_VERSION) -> None:
        """Every table has exactly the columns (names, order, types) its schema version declares."""
        rows = self._conn.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = current_database() ORDER BY table_name, column_index").fetchall()
        found: dict[str, list[tuple[str, str]]] = {}
        for t, c, d in rows:
            found.setdefault(t, []).append((c, d))
        for t in (META, *TABLES):
            want = [(c, _DUCK_TYPES.get(d, d)) for c, d in t.columns]
            if version < SCHEMA_VERSION:  # columns the migrations still have to add
                added = {stmt.split()[5] for v in range(version, SCHEMA_VERSION) for stmt in MIGRATIONS[v]
                         if stmt.startswith(f"ALTER TABLE {t.name} ADD COLUMN")}
                want = [w for w in want if w[0] not in added]
            have = found.get(t.name)
            if have is None:
                raise StoreError(f"{self.path}: table {t.name} is missing (schema version {version})")
            if have != want:
                missing = [f"{c} {d}" for c, d in want if (c, d) not in have]
                extra = [f"{c} {d}" for c, d in have if (c, d) not in want]
                what = "; ".join(x for x in (f"missing {missing}" if missing else "",
                                             f"unexpected {extra}" if extra else "") if x) or "columns out of order"
                raise StoreError(f"{self.path}: table {t.name} does not match schema version {version}: {what}")

    def close(self) -> None:
        """Close the connection; an open batch is rolled back by DuckDB."""
        self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One DuckDB transaction: commit on success, rollback if the block raises.

        Written so that an exception arriving at any point (a signal handler raising between two
        bytecodes) still leaves the store with no transaction open and ready for the next batch."""
        if self._in_batch:
            raise StoreError(f"{self.path}: a batch is already open; batches do not nest")
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        committed = False
        try:
            self._in_batch = True
            self._conn.begin()
            yield
            self._conn.commit()
            committed = True
        finally:
            if not committed:
                try:
                    self._conn.rollback()
                except duckdb.TransactionException:
                    pass  # interrupted before begin() took effect: nothing to roll back
            self._in_batch = False

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        """A write batch: one transaction, committed at the end of the block, rolled back if it raises."""
        with self._transaction():
            b = Batch(self._conn, self.path)
            try:
                yield b
            finally:
                b._open = False

    def write(self, rows: Iterable[Row]) -> None:
        """Write rows in one batch."""
        with self.batch() as b:
            b.add_all(rows)

    def finish_run(self, run_id: str, status: str, message: str | None = None) -> None:
        """Record a run's final status and message, stamped with the current time ('running': not finished)."""
        with self._transaction():
            hit = self._conn.execute(
                "UPDATE runs SET status = ?, message = ?, finished_at = ? WHERE run_id = ? RETURNING run_id",
                [status, message, None if status == "running" else _utcnow(), run_id],
            ).fetchall()
            if not hit:
                raise StoreError(f"{self.path}: no run {run_id!r}")

    def record_elapsed(self, run_id: str, seconds: float) -> None:
        """Record how much of its time budget a run has spent (kept across resumes)."""
        with self.batch() as b:
            b.record_elapsed(run_id, seconds)

    def write_snapshot(self) -> Path:
        """Checkpoint and copy the store to snapshot_path(path) (atomically), for readers while this one writes."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        if self._in_batch:
            raise StoreError(f"{self.path}: cannot snapshot inside a batch")
        self._conn.execute("CHECKPOINT")  # everything committed is now in the file itself, none in the WAL
        dest = snapshot_path(self.path)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        # Copied by another process: DuckDB's lock is a POSIX record lock, which this process would lose
        # the moment it closed any descriptor of the file (as an in-process copy does).
        done = subprocess.run([sys.executable, "-c", "import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])",
                               str(self.path), str(tmp)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"{self.path}: cannot write the snapshot {dest}: {done.stderr.strip()[-300:]}")
        os.replace(tmp, dest)
        return dest

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> pd.DataFrame:
        """Run a SQL query against the store and return its result."""
        return self._conn.execute(query, params).df()

    def build(self, build_key: str) -> BuildRow | None:
        """The build with this key, or None."""
        cols = table(BuildRow.TABLE).column_names
        row = self._conn.execute(f"SELECT {', '.join(cols)} FROM builds WHERE build_key = ?", [build_key]).fetchone()
        return None if row is None else BuildRow(**dict(zip(cols, row)))

    def evaluated_keys(self, run_id: str | None = None) -> set[tuple[str, str]]:
        """(genome_key, cell) pairs with any evaluation, failures included, optionally of one run."""
        query = "SELECT DISTINCT genome_key, cell FROM evaluations"
        params: list[Any] = []
        if run_id is not None:
            query += " WHERE run_id = ?"
            params.append(run_id)
        return {(g, c) for g, c in self._conn.execute(query, params).fetchall()}

    def evaluations(self, run_id: str | None = None, op: str | None = None) -> pd.DataFrame:
        """Evaluations with their candidate's op and template, oldest first, optionally filtered."""
        where, params = [], []
        if run_id is not None:
            where.append("e.run_id = ?")
            params.append(run_id)
        if op is not None:
            where.append("c.op = ?")
            params.append(op)
        query = "SELECT e.*, c.op, c.template FROM evaluations e LEFT JOIN candidates c USING (genome_key)"
        if where:
            query += " WHERE " + " AND ".join(where)
        return self.sql(query + " ORDER BY e.created_at, e.eval_id", params)

    def runs(self) -> pd.DataFrame:
        """All runs, oldest first."""
        return self.sql("SELECT * FROM runs ORDER BY created_at, run_id")


def user_query(store: Store, query: str) -> pd.DataFrame:
    """A user's own SQL (`kfactory sql`) against the store; a DuckDB error is a StoreError with its first line."""
    try:
        return store.sql(query)
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StoreError(f"SQL error: {first}") from None

"""DuckDB implementation of the lesson store: open with a schema check, batched writes, SQL reads.

Only one process may write a store file: DuckDB takes a file lock, so a second writer (or a reader
while a writer holds the file) fails in Store.open. In Kernel Factory the parent process alone
writes; GPU workers return records to it. A Store holds one connection and is not thread-safe.
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pandas as pd

from memory.rows import ROW_TYPES, BuildRow, Row
from memory.schema import SCHEMA_VERSION, OnConflict, Table, ddl, table

# Columns the store stamps with the current time when a row leaves them None.
_STAMPED = ("created_at", "updated_at")


class StoreError(Exception):
    """The store file cannot be used, or a write broke a store rule."""


class SchemaVersionError(StoreError):
    """The store file was written with a different schema version."""

    def __init__(self, path: Path, found: str, expected: int) -> None:
        super().__init__(f"{path}: lesson store schema version {found}, this code expects version {expected}")
        self.path = path
        self.found = found
        self.expected = expected


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
                self._conn.executemany(_insert_sql(t), values)
            except duckdb.ConstraintException as e:
                raise StoreError(f"{self._path}: {t.name}: {e}") from e


class Store:
    """A lesson store file; open with Store.open(path), use as a context manager or close()."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self._conn = conn
        self.path = path
        self.read_only = read_only
        self._in_batch = False

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> "Store":
        """Open or create the store at path; check its schema version."""
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"{path}: no such lesson store")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as e:
            raise StoreError(f"{path}: cannot open as a DuckDB database: {e}") from e
        store = cls(conn, path, read_only)
        try:
            store._init_or_check()
        except BaseException:
            conn.close()
            raise
        return store

    def _init_or_check(self) -> None:
        """Create the schema in an empty database, else check the stored schema version."""
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
            raise SchemaVersionError(self.path, found[0], SCHEMA_VERSION)

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
        """One DuckDB transaction: commit on success, rollback if the block raises."""
        if self._in_batch:
            raise StoreError(f"{self.path}: a batch is already open; batches do not nest")
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        self._in_batch = True
        self._conn.begin()
        try:
            yield
        except BaseException:
            self._conn.rollback()
            raise
        else:
            self._conn.commit()
        finally:
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
        """Record a run's final status and message, stamped with the current time."""
        with self._transaction():
            hit = self._conn.execute(
                "UPDATE runs SET status = ?, message = ?, finished_at = ? WHERE run_id = ? RETURNING run_id",
                [status, message, _utcnow(), run_id],
            ).fetchall()
            if not hit:
                raise StoreError(f"{self.path}: no run {run_id!r}")

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

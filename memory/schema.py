"""Versioned schema of the lesson store: tables, keys and what a re-insert does; the columns are the fields of
the row records (memory.rows), so they are declared once."""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from memory import rows

# Bump when a column or table changes, and add the statements that bring the previous version up to
# it to MIGRATIONS; Store.open upgrades an older file it opens for writing, and refuses newer ones.
SCHEMA_VERSION = 2


class OnConflict(Enum):
    """What inserting a row whose primary key already exists does."""

    IGNORE = "ignore"  # first writer wins: content-addressed or deterministic keys
    UPSERT = "upsert"  # the new row replaces the old one, except the keep_on_update columns
    ERROR = "error"  # a duplicate key is a bug in the caller


@dataclass(frozen=True)
class Table:
    """One table: its columns in order, primary key and conflict policy."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: str | None
    on_conflict: OnConflict
    keep_on_update: tuple[str, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        """Column names in declaration order."""
        return tuple(name for name, _ in self.columns)

    def ddl(self) -> str:
        """CREATE TABLE statement for this table."""
        cols = [f"{name} {sql_type}" + (" PRIMARY KEY" if name == self.key else "") for name, sql_type in self.columns]
        return f"CREATE TABLE {self.name} (\n    " + ",\n    ".join(cols) + "\n)"


META = Table("meta", (("key", "TEXT"), ("value", "TEXT")), key="key", on_conflict=OnConflict.ERROR)

# A row field's SQL type, from its Python type (an optional's None left out; a Literal of strings is TEXT);
# a field may name another in its metadata, as RunRow.seed does (BIGINT).
_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "DOUBLE", datetime: "TIMESTAMP", bytes: "BLOB", bool: "BOOLEAN"}


def _sql_type(name: str, hint: Any, metadata: Mapping[str, Any]) -> str:
    if "sql" in metadata:
        return metadata["sql"]
    if get_origin(hint) is Literal:
        kinds = {type(a) for a in get_args(hint)}
    else:
        options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
        kinds = {a for a in options if a is not type(None)}
    if len(kinds) != 1 or next(iter(kinds)) not in _SQL_TYPES:
        raise TypeError(f"field {name}: no SQL type for {hint!r}")
    return _SQL_TYPES[next(iter(kinds))]


def _table(row_type: type, key: str | None, on_conflict: OnConflict, keep_on_update: tuple[str, ...] = ()) -> Table:
    """The table of a row type: its fields, in order, are the columns."""
    hints = get_type_hints(row_type)
    columns = tuple((f.name, _sql_type(f.name, hints[f.name], f.metadata)) for f in fields(row_type))
    return Table(row_type.TABLE, columns, key, on_conflict, keep_on_update)

# No secondary indexes: DuckDB scans columnar data fast, and ART indexes on non-key columns
# make updates and same-transaction re-inserts fragile.
TABLES: tuple[Table, ...] = (
    _table(rows.RunRow, "run_id", OnConflict.ERROR),
    _table(rows.SourceRow, "source_hash", OnConflict.IGNORE),
    _table(rows.CandidateRow, "genome_key", OnConflict.IGNORE),
    _table(rows.BuildRow, "build_key", OnConflict.IGNORE),
    _table(rows.EvaluationRow, "eval_id", OnConflict.ERROR),
    _table(rows.LessonRow, "lesson_id", OnConflict.UPSERT, keep_on_update=("created_run", "created_at")),
    _table(rows.LessonUseRow, None, OnConflict.ERROR),
    _table(rows.LLMCallRow, "call_id", OnConflict.ERROR),
)


def table(name: str) -> Table:
    """The table called name; KeyError if there is none."""
    for t in TABLES:
        if t.name == name:
            return t
    raise KeyError(name)


def ddl() -> list[str]:
    """Every CREATE TABLE statement of the current schema, meta first."""
    return [META.ddl(), *(t.ddl() for t in TABLES)]


# MIGRATIONS[v]: the statements that turn a version-v store into a version-(v + 1) one. New columns are
# appended, so a migrated table has the same columns, in the same order, as a fresh one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE runs ADD COLUMN elapsed_s DOUBLE",
        "ALTER TABLE runs ADD COLUMN config_path TEXT",
        "ALTER TABLE evaluations ADD COLUMN reused_from TEXT",
        # version 1 marked a reused result only in its error text
        "UPDATE evaluations SET reused_from = regexp_extract(error, '^reused from run (.+)$', 1) "
        "WHERE error LIKE 'reused from run %'",
    ),
}

"""Versioned schema of the lesson store: tables, columns, keys and what a re-insert does."""

from dataclasses import dataclass
from enum import Enum

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

# No secondary indexes: DuckDB scans columnar data fast, and ART indexes on non-key columns
# make updates and same-transaction re-inserts fragile.
TABLES: tuple[Table, ...] = (
    Table(
        "runs",
        (
            ("run_id", "TEXT"),
            ("op", "TEXT"),
            ("arch", "TEXT"),
            ("config_toml", "TEXT"),
            ("config_hash", "TEXT"),
            ("seed", "BIGINT"),
            ("status", "TEXT"),
            ("created_at", "TIMESTAMP"),
            ("finished_at", "TIMESTAMP"),
            ("message", "TEXT"),
            ("elapsed_s", "DOUBLE"),
            ("config_path", "TEXT"),
        ),
        key="run_id",
        on_conflict=OnConflict.ERROR,
    ),
    Table(
        "sources",
        (
            ("source_hash", "TEXT"),
            ("op", "TEXT"),
            ("template", "TEXT"),
            ("text", "TEXT"),
            ("origin", "TEXT"),
            ("parent_hash", "TEXT"),
            ("llm_call_id", "TEXT"),
            ("created_at", "TIMESTAMP"),
        ),
        key="source_hash",
        on_conflict=OnConflict.IGNORE,
    ),
    Table(
        "candidates",
        (
            ("genome_key", "TEXT"),
            ("op", "TEXT"),
            ("template", "TEXT"),
            ("source_hash", "TEXT"),
            ("params_json", "TEXT"),
            ("origin", "TEXT"),
            ("parents_json", "TEXT"),
            ("run_id", "TEXT"),
            ("generation", "INTEGER"),
            ("created_at", "TIMESTAMP"),
        ),
        key="genome_key",
        on_conflict=OnConflict.IGNORE,
    ),
    Table(
        "builds",
        (
            ("build_key", "TEXT"),
            ("genome_key", "TEXT"),
            ("run_id", "TEXT"),
            ("arch", "TEXT"),
            ("dtypes_json", "TEXT"),
            ("consts_json", "TEXT"),
            ("status", "TEXT"),
            ("regs", "INTEGER"),
            ("spill_stores", "INTEGER"),
            ("spill_loads", "INTEGER"),
            ("smem_bytes", "INTEGER"),
            ("stack_bytes", "INTEGER"),
            ("compile_ms", "DOUBLE"),
            ("compiler", "TEXT"),
            ("log", "TEXT"),
            ("error", "TEXT"),
            ("cubin", "BLOB"),
            ("created_at", "TIMESTAMP"),
        ),
        key="build_key",
        on_conflict=OnConflict.IGNORE,
    ),
    Table(
        "evaluations",
        (
            ("eval_id", "TEXT"),
            ("run_id", "TEXT"),
            ("genome_key", "TEXT"),
            ("build_key", "TEXT"),
            ("cell", "TEXT"),
            ("dtypes_json", "TEXT"),
            ("dims_json", "TEXT"),
            ("status", "TEXT"),
            ("median_us", "DOUBLE"),
            ("p10_us", "DOUBLE"),
            ("p90_us", "DOUBLE"),
            ("samples", "INTEGER"),
            ("gbps", "DOUBLE"),
            ("ceiling_gbps", "DOUBLE"),
            ("baseline", "TEXT"),
            ("baseline_us", "DOUBLE"),
            ("speedup", "DOUBLE"),
            ("max_abs_err", "DOUBLE"),
            ("rel_norm_err", "DOUBLE"),
            ("error", "TEXT"),
            ("fingerprint_json", "TEXT"),
            ("fingerprint_class", "TEXT"),
            ("generation", "INTEGER"),
            ("source", "TEXT"),
            ("created_at", "TIMESTAMP"),
            ("reused_from", "TEXT"),
        ),
        key="eval_id",
        on_conflict=OnConflict.ERROR,
    ),
    Table(
        "lessons",
        (
            ("lesson_id", "TEXT"),
            ("kind", "TEXT"),
            ("op", "TEXT"),
            ("arch", "TEXT"),
            ("scope_json", "TEXT"),
            ("text", "TEXT"),
            ("structured_json", "TEXT"),
            ("provenance_json", "TEXT"),
            ("created_run", "TEXT"),
            ("confirmed_run", "TEXT"),
            ("usefulness", "DOUBLE"),
            ("support", "INTEGER"),
            ("created_at", "TIMESTAMP"),
            ("updated_at", "TIMESTAMP"),
        ),
        key="lesson_id",
        on_conflict=OnConflict.UPSERT,
        keep_on_update=("created_run", "created_at"),
    ),
    Table(
        "lesson_uses",
        (
            ("genome_key", "TEXT"),
            ("lesson_id", "TEXT"),
            ("run_id", "TEXT"),
            ("effect", "TEXT"),
            ("created_at", "TIMESTAMP"),
        ),
        key=None,
        on_conflict=OnConflict.ERROR,
    ),
    Table(
        "llm_calls",
        (
            ("call_id", "TEXT"),
            ("run_id", "TEXT"),
            ("role", "TEXT"),
            ("model", "TEXT"),
            ("prompt_hash", "TEXT"),
            ("prompt_template_hash", "TEXT"),
            ("prompt", "TEXT"),
            ("response", "TEXT"),
            ("prompt_tokens", "INTEGER"),
            ("completion_tokens", "INTEGER"),
            ("cost_usd", "DOUBLE"),
            ("latency_s", "DOUBLE"),
            ("outcome", "TEXT"),
            ("error", "TEXT"),
            ("created_at", "TIMESTAMP"),
        ),
        key="call_id",
        on_conflict=OnConflict.ERROR,
    ),
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

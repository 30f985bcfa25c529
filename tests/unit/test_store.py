"""Lesson store: round trips, conflict policies, transactions, schema versioning, reads."""

import ast
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from memory import (
    SCHEMA_VERSION,
    BuildRow,
    CandidateRow,
    EvaluationRow,
    LessonRow,
    LessonUseRow,
    LLMCallRow,
    RunRow,
    SchemaVersionError,
    SourceRow,
    Store,
    StoreError,
    canonical_json,
    source_hash,
)
from memory.rows import ROW_TYPES
from memory.schema import table

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2025, 1, 2, 3, 4, 5, 123456)


def run_row(run_id: str = "r1", **kw) -> RunRow:
    """A run row with every column set."""
    base = dict(
        run_id=run_id,
        op="rmsnorm",
        arch="sm_90a",
        config_toml='[search]\npopulation = 8\n',
        config_hash="cfg0",
        seed=2**40,
        status="running",
        created_at=T0,
        finished_at=T0 + timedelta(hours=1),
        message="hello",
        elapsed_s=12.5,
        config_path="/experiments/x.toml",
    )
    return RunRow(**{**base, **kw})


def candidate_row(genome_key: str = "g1", **kw) -> CandidateRow:
    """A candidate row with every column set."""
    base = dict(
        genome_key=genome_key,
        op="rmsnorm",
        template="rmsnorm/warp",
        source_hash=source_hash("tmpl"),
        params_json=canonical_json({"VEC": 4, "BLOCK": 256}),
        origin="mutate",
        parents_json=canonical_json(["g0"]),
        run_id="r1",
        generation=3,
        created_at=T0,
    )
    return CandidateRow(**{**base, **kw})


def build_row(build_key: str = "b1", **kw) -> BuildRow:
    """A build row with every column set."""
    base = dict(
        build_key=build_key,
        genome_key="g1",
        run_id="r1",
        arch="sm_90a",
        dtypes_json=canonical_json({"x": "bf16"}),
        consts_json=canonical_json({"N": 8192}),
        status="OK",
        regs=40,
        spill_stores=0,
        spill_loads=2,
        smem_bytes=4096,
        stack_bytes=16,
        compile_ms=123.5,
        compiler="nvrtc 13.0 -O3",
        log="ptxas info: Used 40 registers",
        error="",
        cubin=b"\x7fELF\x00\x01\xff",
        created_at=T0,
    )
    return BuildRow(**{**base, **kw})


def evaluation_row(eval_id: str = "e1", **kw) -> EvaluationRow:
    """An evaluation row with every column set."""
    base = dict(
        eval_id=eval_id,
        run_id="r1",
        genome_key="g1",
        build_key="b1",
        cell="rmsnorm/bf16/M4096-N8192",
        dtypes_json=canonical_json({"x": "bf16"}),
        dims_json=canonical_json({"M": 4096, "N": 8192}),
        status="OK",
        median_us=10.5,
        p10_us=10.0,
        p90_us=11.25,
        samples=200,
        gbps=3000.0,
        ceiling_gbps=4200.0,
        baseline="torch",
        baseline_us=21.0,
        speedup=2.0,
        max_abs_err=1e-3,
        rel_norm_err=1e-4,
        error="",
        fingerprint_json=canonical_json({"gpu": "H200"}),
        fingerprint_class="h200",
        generation=3,
        source="gpu",
        created_at=T0,
        reused_from="r0",
    )
    return EvaluationRow(**{**base, **kw})


def lesson_row(lesson_id: str = "l1", **kw) -> LessonRow:
    """A lesson row with every column set."""
    base = dict(
        lesson_id=lesson_id,
        kind="param_prior",
        op="rmsnorm",
        arch="sm_90a",
        scope_json=canonical_json({"dtype": "bf16"}),
        text="VEC=8 wins for N >= 4096",
        structured_json=canonical_json({"param": "VEC", "value": 8}),
        provenance_json=canonical_json({"evals": ["e1"]}),
        created_run="r1",
        confirmed_run="r1",
        usefulness=0.5,
        support=3,
        created_at=T0,
        updated_at=T0,
    )
    return LessonRow(**{**base, **kw})


def all_rows() -> list:
    """One fully populated row of every type."""
    return [
        run_row(),
        SourceRow(
            source_hash=source_hash("tmpl"),
            op="rmsnorm",
            template="rmsnorm/warp",
            text="tmpl",
            origin="llm",
            parent_hash=source_hash("older"),
            llm_call_id="c1",
            created_at=T0,
        ),
        candidate_row(),
        build_row(),
        evaluation_row(),
        lesson_row(),
        LessonUseRow(genome_key="g1", lesson_id="l1", run_id="r1", effect="improved", created_at=T0),
        LLMCallRow(
            call_id="c1",
            run_id="r1",
            role="mutate",
            model="claude",
            prompt_hash="ph",
            prompt_template_hash="pth",
            prompt="rewrite this kernel",
            response="```cuda ...```",
            prompt_tokens=1000,
            completion_tokens=500,
            cost_usd=0.0125,
            latency_s=3.5,
            outcome="ok",
            error="",
            created_at=T0,
        ),
    ]


def read_rows(store: Store, row_type: type) -> list:
    """Every row of row_type's table, rebuilt as row_type, in key order."""
    cols = table(row_type.TABLE).column_names
    cur = store._conn.execute(f"SELECT {', '.join(cols)} FROM {row_type.TABLE} ORDER BY ALL")
    return [row_type(**dict(zip(cols, r))) for r in cur.fetchall()]


def count(store: Store, name: str) -> int:
    """Number of rows in a table."""
    return int(store.sql(f"SELECT count(*) AS n FROM {name}")["n"][0])


@pytest.fixture
def store(tmp_path: Path):
    """A fresh store file."""
    with Store.open(tmp_path / "store.duckdb") as s:
        yield s


@pytest.mark.parametrize("row_type", ROW_TYPES, ids=lambda t: t.__name__)
def test_row_fields_are_the_table_columns(row_type: type) -> None:
    fields = tuple(f.name for f in dataclasses.fields(row_type))
    assert fields == table(row_type.TABLE).column_names


def test_column_types_come_from_the_row_fields() -> None:
    types = {(t, c): d for t in ("runs", "builds", "evaluations", "lessons", "candidates") for c, d in table(t).columns}
    assert types["runs", "seed"] == "BIGINT"  # named in the field's metadata
    assert types["runs", "finished_at"] == "TIMESTAMP" and types["runs", "config_path"] == "TEXT"
    assert types["builds", "cubin"] == "BLOB" and types["builds", "compile_ms"] == "DOUBLE"
    assert types["evaluations", "source"] == "TEXT"  # a Literal of strings
    assert types["candidates", "generation"] == "INTEGER" and types["lessons", "usefulness"] == "DOUBLE"


@pytest.mark.parametrize("index", range(len(ROW_TYPES)), ids=lambda i: type(all_rows()[i]).__name__)
def test_round_trip_every_row_type(tmp_path: Path, index: int) -> None:
    row = all_rows()[index]
    path = tmp_path / "rt.duckdb"
    with Store.open(path) as s:
        s.write([row])
    with Store.open(path) as s:
        assert read_rows(s, type(row)) == [row]


def test_store_stamps_created_at_in_utc(store: Store) -> None:
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    store.write([run_row(created_at=None, finished_at=None), lesson_row(created_at=None, updated_at=None)])
    after = datetime.now(timezone.utc).replace(tzinfo=None)
    (run,) = read_rows(store, RunRow)
    (lesson,) = read_rows(store, LessonRow)
    assert before <= run.created_at <= after
    assert run.finished_at is None
    assert before <= lesson.created_at <= after and lesson.updated_at == lesson.created_at


def test_source_text_twice_is_one_row_first_wins(store: Store) -> None:
    first = SourceRow.of("template text", op="rmsnorm", template="t", origin="disk")
    again = SourceRow.of("template text", op="rmsnorm", template="t", origin="llm", llm_call_id="c9")
    store.write([first])
    store.write([again])
    with store.batch() as b:  # and inside one batch
        b.add_all([again, again])
    (stored,) = read_rows(store, SourceRow)
    assert stored == dataclasses.replace(first, created_at=stored.created_at)
    assert stored.origin == "disk" and stored.llm_call_id is None


def test_source_hash_must_match_text() -> None:
    with pytest.raises(ValueError, match="sha256"):
        SourceRow(source_hash="0" * 64, op="o", template="t", text="x", origin="disk")


def test_candidate_reinsert_first_writer_wins(store: Store) -> None:
    store.write([candidate_row(params_json='{"VEC": 4}')])
    store.write([candidate_row(params_json='{"VEC": 8}', origin="llm")])
    rows = read_rows(store, CandidateRow)
    assert len(rows) == 1
    assert rows[0].params_json == '{"VEC": 4}' and rows[0].origin == "mutate"


def test_build_reinsert_is_noop(store: Store) -> None:
    store.write([build_row(regs=40)])
    with store.batch() as b:
        b.add(build_row(regs=99, status="COMPILE_ERROR"))
        b.add(build_row("b2", regs=64))
    assert store.build("b1") == build_row(regs=40)
    assert store.build("b2").regs == 64
    assert count(store, "builds") == 2


def test_lesson_upsert_keeps_created_run_and_created_at(store: Store) -> None:
    store.write([lesson_row(text="old", usefulness=0.1, support=1)])
    later = T0 + timedelta(days=1)
    store.write(
        [
            lesson_row(
                text="new",
                usefulness=0.9,
                support=7,
                created_run="r2",
                confirmed_run="r2",
                created_at=later,
                updated_at=later,
            )
        ]
    )
    (lesson,) = read_rows(store, LessonRow)
    assert (lesson.text, lesson.usefulness, lesson.support, lesson.confirmed_run) == ("new", 0.9, 7, "r2")
    assert lesson.created_run == "r1" and lesson.created_at == T0
    assert lesson.updated_at == later


def test_lesson_upsert_twice_in_one_batch_last_wins(store: Store) -> None:
    with store.batch() as b:
        b.add_all([lesson_row(text="a"), lesson_row(text="b"), lesson_row(text="c")])
    assert [r.text for r in read_rows(store, LessonRow)] == ["c"]


def test_failed_batch_keeps_earlier_batches_and_nothing_of_itself(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        s.write([run_row("r1"), candidate_row("g1")])
        with pytest.raises(RuntimeError, match="boom"):
            with s.batch() as b:
                b.add(run_row("r2"))
                b.add_all([candidate_row("g2"), build_row("b2")])
                raise RuntimeError("boom")
        assert [r.run_id for r in read_rows(s, RunRow)] == ["r1"]
        # the store stays usable after a rollback
        s.write([run_row("r3")])
    with Store.open(path) as s:
        assert [r.run_id for r in read_rows(s, RunRow)] == ["r1", "r3"]
        assert [r.genome_key for r in read_rows(s, CandidateRow)] == ["g1"]
        assert count(s, "builds") == 0


def test_duplicate_evaluation_raises_and_rolls_back_its_batch(store: Store) -> None:
    store.write([evaluation_row("e1")])
    with pytest.raises(StoreError, match="evaluations"):
        store.write([evaluation_row("e2"), evaluation_row("e1")])
    assert [r.eval_id for r in read_rows(store, EvaluationRow)] == ["e1"]


def test_killed_process_loses_only_its_open_batch(tmp_path: Path) -> None:
    path = tmp_path / "killed.duckdb"
    script = textwrap.dedent(
        f"""
        import os
        from memory import RunRow, Store
        def run(run_id):
            return RunRow(run_id=run_id, op="o", arch="a", config_toml="", config_hash="h", seed=0, status="s")
        s = Store.open({str(path)!r})
        s.write([run("r1")])
        with s.batch() as b:
            b.add(run("r2"))
            os._exit(3)  # no rollback, no close: as if the process were killed
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3
    with Store.open(path) as s:
        assert [r.run_id for r in read_rows(s, RunRow)] == ["r1"]


def test_batches_do_not_nest(store: Store) -> None:
    with store.batch():
        with pytest.raises(StoreError, match="nest"):
            with store.batch():
                pass


def test_add_rejects_non_rows(store: Store) -> None:
    with pytest.raises(TypeError, match="dict"):
        store.write([{"run_id": "r1"}])


def test_status_enum_is_stored_by_name(store: Store) -> None:
    class Status(Enum):
        OK = 1
        COMPILE_ERROR = 2

    store.write([build_row(status=Status.COMPILE_ERROR), evaluation_row(status=Status.OK)])
    assert store.build("b1").status == "COMPILE_ERROR"
    assert store.sql("SELECT status FROM evaluations")["status"].tolist() == ["OK"]


def test_evaluation_source_is_gpu_or_replay() -> None:
    with pytest.raises(ValueError, match="replay"):
        evaluation_row(source="guess")


def test_open_creates_parent_dirs_and_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.duckdb"
    with Store.open(path) as s:
        s.write(all_rows())
    assert path.is_file()
    with Store.open(path) as s:
        assert s.sql("SELECT value FROM meta WHERE key = 'schema_version'")["value"].tolist() == [str(SCHEMA_VERSION)]
        assert all(count(s, t) == 1 for t in ("runs", "sources", "candidates", "builds", "evaluations", "lessons"))
        s.write([run_row("r2")])
    with Store.open(path, read_only=True) as s:
        assert count(s, "runs") == 2
        with pytest.raises(StoreError, match="read-only"):
            s.write([run_row("r3")])


def test_other_schema_version_raises_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    Store.open(path).close()
    with duckdb.connect(str(path)) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError) as info:
        Store.open(path)
    msg = str(info.value)
    assert str(path) in msg and "version 99" in msg and f"version {SCHEMA_VERSION}" in msg
    assert (info.value.found, info.value.expected) == ("99", SCHEMA_VERSION)
    assert isinstance(info.value, StoreError)


def test_non_database_file_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("not a database\n" * 100)
    with pytest.raises(StoreError, match=re.escape(str(path))) as info:
        Store.open(path)
    assert not isinstance(info.value, SchemaVersionError)


def test_duckdb_file_without_meta_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(StoreError, match="meta"):
        Store.open(path)


def test_second_writer_process_is_refused(store: Store) -> None:
    script = f"from memory import Store\nStore.open({str(store.path)!r})"
    proc = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "StoreError" in proc.stderr and str(store.path) in proc.stderr


def test_sql_returns_dataframe_with_values(store: Store) -> None:
    store.write([evaluation_row("e1", median_us=12.0), evaluation_row("e2", median_us=8.0, cell="other")])
    df = store.sql("SELECT eval_id, median_us FROM evaluations WHERE median_us < ? ORDER BY eval_id", [20.0])
    assert isinstance(df, pd.DataFrame)
    assert df.to_dict("records") == [{"eval_id": "e1", "median_us": 12.0}, {"eval_id": "e2", "median_us": 8.0}]
    assert store.sql("SELECT min(median_us) AS m FROM evaluations")["m"][0] == 8.0


def test_build_lookup(store: Store) -> None:
    assert store.build("missing") is None
    store.write([build_row()])
    assert store.build("b1") == build_row()
    assert store.build("b1").cubin == b"\x7fELF\x00\x01\xff"


def test_evaluated_keys_and_evaluations_filters(store: Store) -> None:
    store.write(
        [
            candidate_row("g1", op="rmsnorm"),
            candidate_row("g2", op="kda"),
            evaluation_row("e1", genome_key="g1", cell="c1", run_id="r1"),
            evaluation_row("e2", genome_key="g2", cell="c2", run_id="r2", status="WRONG_ANSWER"),
            evaluation_row("e3", genome_key="g1", cell="c1", run_id="r2", created_at=T0 + timedelta(seconds=1)),
        ]
    )
    assert store.evaluated_keys() == {("g1", "c1"), ("g2", "c2")}
    assert store.evaluated_keys("r2") == {("g2", "c2"), ("g1", "c1")}
    assert store.evaluated_keys("r1") == {("g1", "c1")}
    assert store.evaluated_keys("nope") == set()
    assert store.evaluations()["eval_id"].tolist() == ["e1", "e2", "e3"]
    assert store.evaluations(op="rmsnorm")["eval_id"].tolist() == ["e1", "e3"]
    assert store.evaluations(run_id="r2", op="rmsnorm")["eval_id"].tolist() == ["e3"]
    assert store.evaluations(run_id="r2")["op"].tolist() == ["kda", "rmsnorm"]


def test_finish_run_and_runs(store: Store) -> None:
    store.write([run_row("r2", created_at=T0 + timedelta(1), finished_at=None, message=None), run_row("r1")])
    store.finish_run("r2", "done", "12 evaluations")
    runs = store.runs()
    assert runs["run_id"].tolist() == ["r1", "r2"]
    r2 = runs.iloc[1]
    assert (r2["status"], r2["message"]) == ("done", "12 evaluations")
    assert not pd.isna(r2["finished_at"])
    with pytest.raises(StoreError, match="nope"):
        store.finish_run("nope", "done", "")


def test_memory_imports_nothing_from_evo_or_ops() -> None:
    for module in (REPO / "memory").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("evo", "ops") for n in names), module


def readme_queries() -> list[str]:
    """The SQL blocks of memory/README.md."""
    return re.findall(r"```sql\n(.*?)```", (REPO / "memory" / "README.md").read_text(), flags=re.S)


def test_readme_queries_run_and_cost_per_improvement_is_right(store: Store) -> None:
    def ev(eval_id: str, genome_key: str, us: float, **kw) -> EvaluationRow:
        return evaluation_row(eval_id, genome_key=genome_key, build_key=f"b-{genome_key}", median_us=us, **kw)

    store.write(
        [
            run_row("r1"),
            run_row("r2"),
            candidate_row("p", origin="init", parents_json="[]"),
            candidate_row("q", origin="init", parents_json="[]"),
            candidate_row("a", origin="llm", parents_json='["p"]'),  # faster than p: an improvement
            candidate_row("b", origin="llm", parents_json='["p"]'),  # slower than p
            candidate_row("c", origin="llm", parents_json='["p", "q"]'),  # beats p, not q
            candidate_row("d", origin="mutate", parents_json='["p"]'),  # faster, but not from the LLM
            candidate_row("f", origin="llm", parents_json='["p"]'),  # fast but failed verification
            ev("e1", "p", 10.0),
            ev("e2", "q", 8.0),
            ev("e3", "a", 9.0),
            ev("e4", "a", 7.0, cell="c2"),  # p was not measured in c2: no comparison there
            ev("e5", "b", 11.0),
            ev("e6", "c", 9.0),
            ev("e7", "d", 5.0),
            ev("e8", "f", 1.0, status="WRONG_ANSWER"),
            LLMCallRow(call_id="c1", run_id="r1", role="mutate", model="m", prompt_hash="h",
                       prompt_template_hash=None, prompt="p", response="r", cost_usd=0.25),
            LLMCallRow(call_id="c2", run_id="r1", role="mutate", model="m", prompt_hash="h",
                       prompt_template_hash=None, prompt="p", response=None, cost_usd=0.75, outcome="error"),
            build_row("b-p", genome_key="p"),
            build_row("b-f", genome_key="f", status="COMPILE_ERROR", error="bad"),
            lesson_row(),
        ]
    )
    queries = readme_queries()
    assert len(queries) >= 5
    for query in queries:
        assert isinstance(store.sql(query), pd.DataFrame)
    (cost_query,) = [q for q in queries if q.startswith("-- cost per accepted improvement")]
    got = store.sql(cost_query).to_dict("records")
    assert got[0] == {"run_id": "r1", "llm_usd": 1.0, "improvements": 1, "usd_per_improvement": 1.0}
    assert got[1]["run_id"] == "r2" and got[1]["improvements"] == 0 and pd.isna(got[1]["usd_per_improvement"])

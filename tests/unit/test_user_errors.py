"""Every user error is one clear line and a non-zero exit code; `kfactory lessons` reads in 100 columns."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb
import pytest

from evo.cli.main import main
from evo.export.errors import ExportError
from evo.templates.template import load_templates, parse_template
from memory import Store
from tests.unit import fixture_store as fx
from tests.unit.test_search_replay import SMALL

ROOT = Path(__file__).resolve().parents[2]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err  # one line, no traceback
    return lines[0]


def _config(tmp_path: Path, text: str = SMALL, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text.replace("{gens}", "2"))
    return p


@pytest.fixture(scope="module")
def lessons_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fx.build_fixture_store(tmp_path_factory.mktemp("le") / "s.duckdb", lessons=True)


@pytest.mark.parametrize("query, says", [
    ("SELEC 1", "SQL error: Parser Error"),
    ("DROP TABLE runs", "SQL error: Invalid Input Error: Cannot execute statement of type \"DROP\""),
    ("SELECT nope FROM runs", "SQL error: Binder Error"),
    ("", "empty query"),
    ("   ", "empty query"),
], ids=["syntax", "drop-read-only", "unknown-column", "empty", "blank"])
def test_sql_errors(lessons_store: Path, capsys, query: str, says: str) -> None:
    assert main(["sql", query, "--store", str(lessons_store)]) == 2
    line = _err(capsys)
    assert line.startswith("kfactory sql: error: ") and says in line
    with Store.open(lessons_store, read_only=True) as s:
        assert len(s.runs()) == 3  # nothing dropped


@pytest.mark.parametrize("argv, says", [
    (["lessons", "--kind", "bogus"], "argument --kind: invalid choice: 'bogus'"),
    (["lessons", "--limit", "0"], "argument --limit: must be >= 1, got 0"),
    (["lessons", "--limit", "-3"], "must be >= 1"),
    (["lessons", "--limit", "ten"], "'ten' is not a whole number"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
], ids=["kind", "limit-0", "limit-negative", "limit-text", "command"])
def test_bad_arguments_are_one_line(capsys, argv: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = _err(capsys)
    assert says in line and "--help" in line


def test_non_utf8_config(tmp_path: Path, capsys) -> None:
    p = tmp_path / "latin1.toml"
    p.write_bytes('[run]\nop = "rmsnorm"\nname = "caf\u00e9"\n'.encode("latin-1"))
    assert main(["run", str(p), "--store", str(tmp_path / "s.duckdb")]) == 2
    line = _err(capsys)
    assert "latin1.toml" in line and "not UTF-8 text" in line


@pytest.mark.parametrize("section, says", [
    ("[budget]\nmax_seconds = -5\n", "budget.max_seconds: must be > 0, got -5"),
    ("[budget]\nmax_evals = -1\n", "budget.max_evals"),
    ("[search]\nelite = -1\n", "search.elite"),
    ("[search]\ntournament = 0\n", "search.tournament"),
    ("[eval]\nwarmup = -2\n", "eval.warmup"),
    ("[eval]\nmin_samples = 200\nmax_samples = 150\n", "eval.max_samples"),
    ("[build]\ntimeout_s = -1\n", "build.timeout_s"),
    ("[llm]\nbudget_usd = -1.0\n", "llm.budget_usd"),
], ids=["max-seconds", "max-evals", "elite", "tournament", "warmup", "samples", "build-timeout", "llm-budget"])
def test_negative_budgets_and_limits_are_refused(tmp_path: Path, capsys, section: str, says: str) -> None:
    text = SMALL.replace("[budget]\n", "[budget_]\n").replace("[budget_]\nmax_evals = 2000\ngenerations = {gens}\n"
                                                                "patience = 50\n", "")
    head = section.split("\n")[0]
    if head in text:  # merge into the existing section instead of repeating it
        text = text.replace(head + "\n", section)
    else:
        text += section
    store = tmp_path / "s.duckdb"
    assert main(["run", str(_config(tmp_path, text)), "--store", str(store)]) == 2
    assert says in _err(capsys)
    assert not store.exists()  # refused before anything was recorded


def test_cells_the_replay_data_does_not_cover_are_refused(tmp_path: Path, capsys) -> None:
    text = SMALL.replace("dims = { M = [4096], N = [1024, 8192] }", "dims = { M = [4096, 4000], N = [1024] }")
    store = tmp_path / "s.duckdb"
    assert main(["run", str(_config(tmp_path, text)), "--store", str(store), "--run-id", "u"]) == 2
    line = _err(capsys)
    assert "cells: the replay data" in line and "no OK measurement for 1 of the 2 cells" in line
    listed = line.split("cells: ", 2)[-1]
    assert "M4000-N1024" in listed and "M4096-N1024" not in listed
    assert not store.exists() and not Path(f"{store}.wal").exists()  # validated before the run was recorded


def test_a_refused_run_leaves_no_new_store_and_an_old_one_untouched(lessons_store: Path, tmp_path: Path,
                                                                   capsys) -> None:
    bad = _config(tmp_path, SMALL.replace('op = "rmsnorm"', 'op = "nope"'))
    new = tmp_path / "new" / "deeper" / "s.duckdb"
    assert main(["run", str(bad), "--store", str(new)]) == 2
    assert "unknown op 'nope'" in _err(capsys)
    assert not (tmp_path / "new").exists()  # no file, no WAL, no folder made for them
    old = tmp_path / "old.duckdb"
    shutil.copy(lessons_store, old)
    before = (old.read_bytes(), old.stat().st_mtime_ns)
    assert main(["run", str(bad), "--store", str(old)]) == 2
    assert "unknown op 'nope'" in _err(capsys)
    assert (old.read_bytes(), old.stat().st_mtime_ns) == before and not Path(f"{old}.wal").exists()


def test_missing_replay_data_names_the_key(tmp_path: Path, capsys) -> None:
    text = re.sub(r'replay_data = ".*"', 'replay_data = "nowhere.parquet"', SMALL)
    assert main(["run", str(_config(tmp_path, text)), "--store", str(tmp_path / "s.duckdb")]) == 2
    line = _err(capsys)
    assert "run.replay_data: file not found" in line and str(tmp_path / "nowhere.parquet") in line


def test_a_constraint_that_raises_a_security_error_fails_the_run_cleanly(tmp_path: Path, capsys, monkeypatch) -> None:
    real = load_templates("rmsnorm")
    text = real["cta_row"].text.replace("[constraints]\n", "[constraints]\nsneaky = \"vec.__class__.__name__ == 'int'\"\n", 1)
    assert "sneaky" in text
    bad = dict(real, cta_row=parse_template(text, "cta_row with a sneaky constraint", trusted=True))
    monkeypatch.setattr("evo.loop.pipeline.load_templates", lambda op, **kw: bad)
    store = tmp_path / "s.duckdb"
    assert main(["run", str(_config(tmp_path)), "--store", str(store), "--run-id", "sec"]) == 2
    line = _err(capsys)
    assert "constraint sneaky" in line and "SecurityError" in line and "__class__" in line
    with Store.open(store, read_only=True) as s:
        run = s.sql("SELECT status, message, finished_at FROM runs WHERE run_id = 'sec'").iloc[0]
    assert run.status == "failed" and "SecurityError" in run.message and run.finished_at is not None


def test_report_out_on_an_existing_file(lessons_store: Path, tmp_path: Path, capsys) -> None:
    f = tmp_path / "report.md"
    f.write_text("keep me")
    assert main(["report", fx.RUN2, "--out", str(f), "--store", str(lessons_store)]) == 2
    assert "is a file" in _err(capsys) and f.read_text() == "keep me"
    assert main(["report", fx.RUN2, "--out", str(f / "sub"), "--store", str(lessons_store)]) == 2
    assert "a file is in the way" in _err(capsys)


def test_report_out_refuses_a_folder_with_files(lessons_store: Path, tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("keep me")
    assert main(["report", fx.RUN2, "--out", str(mine), "--store", str(lessons_store)]) == 2
    assert "is not empty" in _err(capsys)
    assert [x.name for x in mine.iterdir()] == ["report.md"] and (mine / "report.md").read_text() == "keep me"


def test_export_latest_is_the_newest_run_as_for_report(lessons_store: Path, tmp_path: Path, capsys,
                                                        monkeypatch) -> None:
    asked: list[list[str]] = []

    def stop(store: Path, runs: list[str], *args: object, **kw: object) -> None:
        asked.append(list(runs))
        raise ExportError("stopped here")  # packaging itself is test_export's

    monkeypatch.setattr("evo.cli.export.export", stop)
    assert main(["export", "latest", "--store", str(lessons_store), "--out", str(tmp_path / "o")]) == 2
    assert "stopped here" in _err(capsys)
    with Store.open(lessons_store, read_only=True) as s:
        newest = s.sql("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").run_id[0]
    assert asked == [[newest]]
    empty = tmp_path / "empty.duckdb"
    Store.open(empty).close()
    assert main(["export", "latest", "--store", str(empty), "--out", str(tmp_path / "o")]) == 2
    line = _err(capsys)
    assert "no run 'latest'" in line and "holds no runs" in line and not asked[1:]


def test_a_store_whose_columns_do_not_match_its_version(tmp_path: Path, capsys) -> None:
    p = tmp_path / "s.duckdb"
    Store.open(p).close()
    with duckdb.connect(str(p)) as conn:
        conn.execute("ALTER TABLE evaluations DROP COLUMN speedup")
    for argv in (["sql", "SELECT 1"], ["lessons"], ["report"]):
        assert main([*argv, "--store", str(p)]) == 2
        line = _err(capsys)
        assert "table evaluations does not match schema version 2: missing ['speedup DOUBLE']" in line


def test_unknown_run_is_one_line(lessons_store: Path, capsys) -> None:
    assert main(["resume", "nope", "--store", str(lessons_store)]) == 2
    assert "no run 'nope'" in _err(capsys)


# ---------------------------------------------------------------- kfactory lessons


def test_lessons_fit_100_columns_significant_then_most_useful_first(lessons_store: Path, capsys,
                                                                     monkeypatch) -> None:
    for columns in ("100", "250"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["lessons", "--store", str(lessons_store), "--limit", "200"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out and max(len(x) for x in out) <= 100
    heads = [x for x in out if not x.startswith("    ")]
    # one block per lesson, its head then its wrapped text: the text joined again
    texts = [" ".join(x.strip() for x in b.splitlines()[1:]) for b in re.split(r"\n(?=\S)", "\n".join(out))]
    weak = ["not significant" in t for t in texts]
    useful = [float(re.search(r"usefulness ([-+]\d+\.\d+)", h).group(1)) for h in heads]
    assert len(heads) == len(texts) == 45
    assert weak == sorted(weak) and any(weak)  # lessons whose test found no significant effect come last
    for group in (False, True):  # each group most useful first
        mine = [u for u, w in zip(useful, weak) if w is group]
        assert mine == sorted(mine, reverse=True)
    assert useful[0] > 0.0  # earned usefulness leads, not a wall of champions at 0.0
    assert all(x.startswith("    ") for x in out if x not in heads)  # text wrapped under its lesson


def test_lessons_for_an_unknown_op_is_one_line(lessons_store: Path, capsys) -> None:
    assert main(["lessons", "--op", "nope", "--store", str(lessons_store)]) == 2
    line = _err(capsys)
    assert line.startswith("kfactory lessons: error: unknown op 'nope'; known ops: ") and "rmsnorm" in line


def test_lessons_limit_says_what_is_left(lessons_store: Path, capsys) -> None:
    with Store.open(lessons_store, read_only=True) as s:
        n = s.sql("SELECT count(*) AS n FROM lessons WHERE kind = 'param_effect'").n[0]
    assert main(["lessons", "--store", str(lessons_store), "--limit", "5", "--kind", "param_effect"]) == 0
    out = capsys.readouterr().out
    assert sum(1 for x in out.splitlines() if x.startswith("param_effect |")) == 5
    assert f"... {n - 5} more (not significant last; else most useful" in out

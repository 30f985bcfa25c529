"""Without a GPU: the compile-only runner (run.runner = "compile", "none" its older name) is documented, named by
the GPU runner's error, and reported as what it was (genomes built, builds by status), not as an empty search."""

from __future__ import annotations

from pathlib import Path

import pytest

from evo.cli.main import main
from evo.loop.build_summary import BuildSummary
from memory import Store
from tests.unit.test_loud_failures import JINJA_ERROR, OK_BODY, _err_line, _run, _small, _template, root  # noqa: F401
from tests.unit.test_search_replay import SMALL


def _report(store: Path, run_id: str) -> str:
    assert main(["report", run_id, "--store", str(store)]) == 0
    return (store.parent / "runs" / run_id / "report" / "report.md").read_text()


def test_a_compile_only_run_is_reported_as_one_and_a_rerun_as_what_it_reused(root: Path, tmp_path: Path,
                                                                             capsys) -> None:
    _template(root, "good", OK_BODY)
    _template(root, "bad", JINJA_ERROR)
    code, store = _run(tmp_path, _small(["good", "bad"], runner="compile"))
    assert code == 0, capsys.readouterr().err
    first = "2 distinct: 1 OK, 1 RENDER_ERROR (2 compiled in this run, 0 reused from the store)"
    assert f"builds: {first}\n" in capsys.readouterr().out
    md = _report(store, "r")
    assert "| runner | compile |" in md
    assert "| status | done: compile only (run.runner = 'compile'): built, nothing evaluated |" in md
    assert "| candidates | compile-only run (run.runner = 'compile'): none evaluated |" in md
    assert f"| builds | {first} |" in md  # the console's words
    assert "**Compile-only run**: nothing was evaluated" in md
    assert "0 genomes over 0 generation" not in md and "0 used" not in md and "No OK evaluation" not in md

    # the same builds again ('none' is the runner's older name): the store keeps each under the run that made it
    cfg = tmp_path / "again.toml"
    cfg.write_text(_small(["good", "bad"], runner="none"))
    assert main(["run", str(cfg), "--store", str(store), "--run-id", "r2"]) == 0
    again = "2 distinct: 1 OK, 1 RENDER_ERROR (0 compiled in this run, 2 reused from the store)"
    assert f"builds: {again}\n" in capsys.readouterr().out
    md = _report(store, "r2")
    assert f"| builds | {again} |" in md and "| runner | compile |" in md and "0 genomes" not in md
    with Store.open(store, read_only=True) as s:
        run = s.sql("SELECT status, message FROM runs WHERE run_id = 'r2'").iloc[0]
    assert run.status == "done" and run.message.endswith(f"; builds: {again}")


def test_no_gpu_error_names_the_compile_runner(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("evo.measure.run.gpu_available", lambda: False)
    monkeypatch.setattr("evo.cli.commands.run_build_stage", lambda session: BuildSummary())  # no compile needed
    code, _ = _run(tmp_path, SMALL.replace('runner = "replay"', 'runner = "gpu"').replace("{gens}", "2"))
    _, line = _err_line(capsys)
    assert code == 2 and "needs an NVIDIA GPU" in line
    assert 'run.runner = "compile"' in line and "replay" not in line  # replay needs data recorded on a GPU


def test_run_help_lists_the_runners_and_says_compile_needs_no_gpu(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "without a GPU: run.runner = 'compile'" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    for runner in ("'gpu'", "'compile'", "'replay'"):
        assert runner in text
    assert "'compile' renders and compiles only" in text and "needs no GPU" in text

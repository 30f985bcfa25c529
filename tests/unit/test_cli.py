"""`kfactory run` and `kfactory sql` end to end on the CPU, with a real DuckDB file."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from evo.cli.main import main, parser

ROOT = Path(__file__).resolve().parents[2]


def test_help_documents_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in parser()._subparsers._group_actions[0].choices:  # noqa: SLF001
        assert cmd in out


def test_every_option_has_help():
    def actions(p: argparse.ArgumentParser, path: str):
        for a in p._actions:  # noqa: SLF001
            if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                for c in a._choices_actions:  # noqa: SLF001
                    yield f"{path} {c.dest}", c.help
                for name, sub in a.choices.items():
                    yield from actions(sub, f"{path} {name}")
            elif not isinstance(a, argparse._HelpAction):  # noqa: SLF001
                yield f"{path} {'/'.join(a.option_strings) or a.dest}", a.help

    seen = dict(actions(parser(), "kfactory"))
    assert "kfactory bench --arch" in seen and "kfactory export runs" in seen  # the walk reaches every command
    assert [name for name, text in seen.items() if not (text or "").strip()] == []


def test_run_builds_population_and_records_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("evo.measure.run.gpu_available", lambda: False)
    store = tmp_path / "s.duckdb"
    rc = main(["run", str(ROOT / "experiments" / "rmsnorm_h200.toml"), "--store", str(store)])
    err = capsys.readouterr().err
    assert rc == 2 and "needs an NVIDIA GPU" in err
    rc = main(["sql", "SELECT count(*) AS n FROM builds WHERE status = 'OK' AND arch = 'sm_90a' AND regs > 0",
               "--store", str(store)])
    out = capsys.readouterr().out
    assert rc == 0
    assert int(out.split()[-1]) >= 16
    main(["sql", "SELECT status FROM runs", "--store", str(store)])
    assert "stopped" in capsys.readouterr().out


def test_unknown_config_key_is_one_clear_line(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text('[run]\nop = "rmsnorm"\nthreadz = 1\n')
    assert main(["run", str(p), "--store", str(tmp_path / "s.duckdb")]) == 2
    assert "run.threadz" in capsys.readouterr().err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "evo.cli.main", "sql", "SELECT 42 AS answer", "--store",
                        str(ROOT / ".kfactory-test-nonexistent.duckdb")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "no store" in r.stderr


def test_readme_commands_table_lists_every_command():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Commands"):].split("\n\n")[1]
    listed = {line.split("`")[1].split()[1] for line in table.splitlines() if line.startswith("| `kfactory ")}
    assert listed == set(parser()._subparsers._group_actions[0].choices)  # noqa: SLF001

"""A run a person can watch and stop: run ids bound to configs, Ctrl-C and SIGTERM, live readers, config paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.core.config import load_config, parse_config
from memory import Store
from tests.unit.test_search_replay import SMALL, SWEEP

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, gens: int, name: str = "c.toml", text: str = SMALL) -> Path:
    p = tmp_path / name
    p.write_text(text.replace("{gens}", str(gens)))
    return p


def _cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evo.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _run_row(store: Path, run_id: str):
    with Store.open(store, read_only=True) as s:
        return s.sql("SELECT * FROM runs WHERE run_id = ?", [run_id]).iloc[0]


def _n_evals(store: Path, run_id: str) -> int:
    with Store.open(store, read_only=True) as s:
        return int(s.sql("SELECT count(*) AS n FROM evaluations WHERE run_id = ?", [run_id]).n[0])


def _children(pid: int) -> list[int]:
    """Direct child processes of pid (every thread's), from /proc."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text]
    return out


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # exited, waiting to be reaped by init
            return True
        time.sleep(0.1)
    return False


def _start(cfg: Path, store: Path, run_id: str) -> subprocess.Popen:
    """`kfactory run` in its own process group (as a shell runs it), once its first generations are recorded."""
    p = subprocess.Popen([sys.executable, "-m", "evo.cli.main", "run", str(cfg), "--store", str(store), "--run-id", run_id],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen = ""
    deadline = time.time() + 300
    while "gen   1" not in seen and time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen += line
    assert "gen   1" in seen, seen + (p.stderr.read() if p.poll() is not None else "")
    return p


# ---------------------------------------------------------------- a run id is bound to its config


def test_a_run_id_cannot_continue_under_another_config(tmp_path: Path, capsys) -> None:
    store = tmp_path / "s.duckdb"
    first = _config(tmp_path, 2, "first.toml")
    other = _config(tmp_path, 2, "other.toml", SMALL.replace("seed = 3", "seed = 4"))
    assert main(["run", str(first), "--store", str(store), "--run-id", "r"]) == 0
    capsys.readouterr()
    before = (_run_row(store, "r"), _n_evals(store, "r"))
    assert main(["run", str(other), "--store", str(store), "--run-id", "r"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1
    assert f"run r was started with {first}" in err[0] and "not this one" in err[0]
    assert f"kfactory run {other}" in err[0] and "kfactory resume r" in err[0]
    after = _run_row(store, "r")
    assert (after.config_hash, after.seed, after.status) == (before[0].config_hash, 3, "done")
    assert _n_evals(store, "r") == before[1]
    assert main(["run", str(first), "--store", str(store), "--run-id", "r"]) == 0  # same config: continues


# ---------------------------------------------------------------- paths relative to the config file


def test_paths_in_a_config_are_relative_to_the_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sweep.parquet").symlink_to(SWEEP)
    (tmp_path / "exp").mkdir()
    text = SMALL.replace(f'replay_data = "{SWEEP}"', 'replay_data = "../data/sweep.parquet"')
    cfg = _config(tmp_path / "exp", 2, text=text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    c = load_config(Path("..") / "exp" / "c.toml")
    assert c.run.replay_data == str(tmp_path / "data" / "sweep.parquet") and c.path == str(cfg)
    assert parse_config(cfg.read_text()).run.replay_data == "../data/sweep.parquet"  # text alone: the working dir
    store = tmp_path / "s.duckdb"
    assert main(["run", "../exp/c.toml", "--store", str(store), "--run-id", "rel"]) == 0
    assert _run_row(store, "rel").config_path == str(cfg)
    assert _n_evals(store, "rel") > 0
    r = _cli("resume", "rel", "--store", str(store), cwd=tmp_path / "data")  # from yet another folder
    assert r.returncode == 0, r.stderr


def test_the_shipped_replay_config_runs_from_any_folder() -> None:
    c = load_config(ROOT / "experiments" / "rmsnorm_replay.toml")
    assert Path(c.run.replay_data) == SWEEP and Path(c.run.replay_data).is_file()


# ---------------------------------------------------------------- Ctrl-C, SIGTERM, resume, live readers


def test_ctrl_c_records_the_run_ends_children_and_says_how_to_resume(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    cfg = _config(tmp_path, 40)
    p = _start(cfg, store, "ctl")
    try:
        kids = _children(p.pid)
        assert kids, "a replay run keeps a compile process"
        # While the run holds the store, readers read its snapshot (what notebooks do: Store.open read-only).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:  # three readers at once, all while the run goes on
            q, lessons, report = pool.map(lambda a: _cli(*a), [
                ("sql", "SELECT count(*) AS n FROM evaluations", "--store", str(store)),
                ("lessons", "--store", str(store)),
                ("report", "ctl", "--store", str(store), "--out", str(tmp_path / "rep"))])
        assert q.returncode == 0, q.stderr
        assert int(q.stdout.split()[-1]) > 0 and "reading its snapshot" in q.stderr
        assert lessons.returncode == 0, lessons.stderr
        assert report.returncode == 0, report.stderr
        assert p.poll() is None  # still running: the readers read it live
        assert "| status | running |" in (tmp_path / "rep" / "report.md").read_text()
        with Store.open(store, read_only=True) as s:
            assert s.snapshot is not None and s.runs().status.tolist() == ["running"]
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "SIGINT" in lines[0] and f"kfactory resume ctl --store {store}" in lines[0]
    assert all(_gone(k) for k in kids)
    run = _run_row(store, "ctl")
    assert run.status == "interrupted" and run.elapsed_s > 0 and run.finished_at is not None
    n = _n_evals(store, "ctl")
    with Store.open(store) as s:  # leave the resume a few seconds of its hour, to keep this test short
        s.record_elapsed("ctl", 3597.0)
    r = _cli("resume", "ctl", "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert "resumed ctl" in r.stdout and _run_row(store, "ctl").status == "done"
    assert _n_evals(store, "ctl") > n and _run_row(store, "ctl").elapsed_s >= 3597.0


def test_sigterm_ends_the_children_too_and_resume_keeps_the_time_budget(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    p = _start(_config(tmp_path, 60), store, "term")
    try:
        kids = _children(p.pid)
        p.send_signal(signal.SIGTERM)  # to the run alone, as a scheduler or `kill` does
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert "SIGTERM" in err and "kfactory resume term" in err
    assert kids and all(_gone(k) for k in kids)
    assert _run_row(store, "term").status == "interrupted"
    n = _n_evals(store, "term")
    with Store.open(store) as s:  # as if the run had already spent its hour (budget.max_seconds = 3600)
        s.record_elapsed("term", 3595.0)
    r = _cli("resume", "term", "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert "stopped: budget.max_seconds (3600) reached" in r.stdout, r.stdout  # 5 s left, not a fresh hour
    assert _n_evals(store, "term") > n and _run_row(store, "term").elapsed_s >= 3600.0
    with Store.open(store) as s:
        s.record_elapsed("term", 4000.0)
    m = _n_evals(store, "term")
    r = _cli("resume", "term", "--store", str(store))
    assert "stopped: budget.max_seconds (3600) reached" in r.stdout and _n_evals(store, "term") == m


def test_interrupt_outside_a_run_is_one_line(monkeypatch, capsys) -> None:
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("evo.cli.commands.cmd_sql", boom)
    assert main(["sql", "SELECT 1"]) == 130
    assert capsys.readouterr().err.strip() == "kfactory sql: interrupted (SIGINT)"


@pytest.mark.parametrize("dummy", [0])
def test_sigint_ignored_by_children_of_a_builder(dummy: int) -> None:
    """A compile process ignores SIGINT (its parent ends it) and exits when its parent dies."""
    code = ("import os, signal, time\n"
            "from evo.build.nvrtc import Builder\n"
            "b = Builder(workers=1)\n"
            "from evo.build.nvrtc import _Compiler\n"
            "c = _Compiler.start()\n"
            "print(c.proc.pid, flush=True)\n"
            "c.conn.recv()\n"  # ready
            "os.kill(c.proc.pid, signal.SIGINT)\n"
            "time.sleep(1.0)\n"
            "print(c.proc.is_alive(), flush=True)\n"
            "os._exit(0)\n")  # the parent dies without ending it
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid, alive = r.stdout.split()[:2]
    assert alive == "True", r.stderr  # SIGINT did not kill it
    assert "KeyboardInterrupt" not in r.stderr
    assert _gone(int(pid), within=5.0)  # orphaned: it noticed and left

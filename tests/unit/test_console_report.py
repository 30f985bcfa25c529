"""What `kfactory run` prints at its end and what `kfactory report` writes for the same run say the same numbers
in the same words: evaluations by status, evaluations measured and reused, builds used, the geomean speedup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.cli.report import best_so_far
from memory.results import run_evaluations
from memory.store import Store
from tests.unit.test_search_replay import SMALL


def _counts(text: str) -> dict[str, int]:
    """'18 OK, 1 UNKNOWN' -> {'OK': 18, 'UNKNOWN': 1}."""
    return {s: int(n) for n, s in (c.split() for c in text.split(", "))}


def _one(pattern: str, text: str) -> re.Match[str]:
    hits = list(re.finditer(pattern, text, re.M))
    assert len(hits) == 1, (pattern, text)
    return hits[0]


def test_console_and_report_agree_on_counts_and_geomean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL.replace("{gens}", "2"))  # its second generation asks for a pair replay never measured
    store = tmp_path / "s.duckdb"
    assert main(["run", str(cfg), "--store", str(store), "--run-id", "r", "--max-seconds", "900"]) == 0
    out = capsys.readouterr().out
    assert main(["report", "r", "--store", str(store), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()

    # evaluations by status: Status names on both sides (no 'failed' on the console against UNKNOWN in the report)
    table = md[md.index("## Evaluations by status"):md.index("## Builds by status")]
    by_status = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\w+) \| (\d+) \|$", table, re.M)}
    end = _one(r"^evaluations: (.+); by status: (.+)$", out)
    assert _counts(end[2]) == by_status and "UNKNOWN" in by_status and "failed" not in out
    last_gen = [x for x in out.splitlines() if x.startswith("gen ")][-1]
    assert _counts(re.search(r"evaluated +\d+ \((.+?)\)", last_gen)[1]) == by_status  # no REJECTED in this run
    # evaluations measured / reused, and builds used / compiled / reused: the same text
    assert f"| evaluations | {end[1]} |" in md
    builds = _one(r"^builds: (\d+ used: .+)$", out)[1]
    assert f"| builds | {builds} |" in md
    distinct = _one(r"^builds: (\d+) distinct: ", out)[1]
    assert builds.startswith(f"{distinct} used: ")
    # the geomean speedup: the end of the run, its last progress line, the report and its best-so-far curve
    gm = _one(r"; geomean speedup: ([\d.]+ over \d+ of \d+ cells)", out)[1]
    assert f"**Geomean speedup: {gm} (cells with a baseline)**" in md
    assert re.search(r"geomean speedup +([\d.]+)", last_gen)[1] == gm.split()[0]
    with Store.open(store, read_only=True) as s:
        curve = best_so_far(run_evaluations(s, "r"))
    assert f"{curve[-1]:.3f}" == gm.split()[0] and gm.endswith("over 2 of 2 cells")

    # the run recorded the budget it ran under (a resume reads it), and its evaluations export to what `evals` reads
    with Store.open(store, read_only=True) as s:
        (toml,) = s.sql("SELECT config_toml FROM runs WHERE run_id = 'r'").config_toml
        n = len(run_evaluations(s, "r"))
    assert "max_seconds = 900.0  # set by --max-seconds" in toml
    ev = tmp_path / "ev" / "evaluations.parquet"
    assert main(["evals", "export", "latest", str(ev), "--store", str(store)]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {n} evaluations of run r to {ev}\n")
    assert main(["evals", "templates", str(ev), str(tmp_path / "t")]) == 0
    assert '"evaluations": %d' % n in (tmp_path / "t.json").read_text()
    assert main(["evals", "export", "r", str(ev), "--store", str(store)]) == 2  # nothing overwritten
    assert capsys.readouterr().err.count("\n") == 1

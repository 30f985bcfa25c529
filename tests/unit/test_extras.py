"""The base install runs the replay demo and its report; the LLM operator and Ray are extras, and a config that
needs a missing one is refused in one line naming the extra, before any store file is made."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from evo.cli.main import main
from tests.unit.test_search_replay import SMALL

ROOT = Path(__file__).resolve().parents[2]

_DEMO = """
import json, sys
from evo.cli.main import main
cfg, store = sys.argv[1:]
assert main(["run", cfg, "--store", store, "--run-id", "r"]) == 0
assert main(["report", "r", "--store", store]) == 0
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def _name(requirement: str) -> str:
    """'pytest-xdist>=3.5' -> 'pytest_xdist' (a distribution name as packages_distributions() spells it)."""
    return re.split(r"[\[<>=~! ;]", requirement, maxsplit=1)[0].replace("-", "_").lower()


def test_a_replay_run_and_its_report_import_nothing_an_extra_installs(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras_only = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs} - base
    assert {"litellm", "ray", "pytest"} <= extras_only
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL.replace("{gens}", "1"))
    r = subprocess.run([sys.executable, "-c", _DEMO, str(cfg), str(tmp_path / "s.duckdb")], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    dists = packages_distributions()
    imported = {d.replace("-", "_").lower(): m for m in json.loads(r.stdout.splitlines()[-1])
                for d in dists.get(m, ())}
    assert not {d: imported[d] for d in extras_only & set(imported)}


@pytest.mark.parametrize("section, module, extra", [
    ('[llm]\nmodel = "openai/gpt-4o-mini"\n', "litellm", "llm"),
    ('[run]\nbackend = "ray"\n', "ray", "ray"),
], ids=["llm", "ray"])
def test_a_config_needing_a_missing_extra_is_one_line_and_no_store(tmp_path: Path, capsys, monkeypatch,
                                                                   section: str, module: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what an import sees where the package is not installed
    text = SMALL.replace("{gens}", "1")
    text = text.replace("[run]\n", section, 1) if section.startswith("[run]") else text + section
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    store = tmp_path / "new" / "s.duckdb"
    assert main(["run", str(cfg), "--store", str(store)]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and f"needs {module}, which is not installed" in lines[0]
    assert f"pip install -e '.[{extra}]'" in lines[0]
    assert not store.exists() and not store.parent.exists()

"""The notebooks run top to bottom against the fixture store, and are kept without outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.unit import fixture_store as fx

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = ("run_analysis.ipynb", "lesson_explorer.ipynb")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture store with lessons, uses and usefulness; and without any lesson."""
    root = tmp_path_factory.mktemp("nb")
    raw = fx.build_fixture_store(root / "raw.duckdb")
    shutil.copy(raw, root / "lessons.duckdb")
    return {"lessons": fx.add_lessons(root / "lessons.duckdb"), "raw": raw}


def outputs(nb: nbformat.NotebookNode) -> tuple[str, int]:
    """Every text the executed cells printed or displayed, and the number of images they drew."""
    parts, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                parts.append(str(out.data.get("text/plain", "")))
                images += "image/png" in out.data
    return "\n".join(parts), images


@pytest.mark.parametrize(
    "name, store, env, expected, images",
    [
        (
            "run_analysis.ipynb",
            "lessons",
            {"KF_RUN": fx.RUN2},
            ["analysing fx-r2 (rmsnorm on sm_90a)", "parameter effects", "tail elements wrong"],
            3,
        ),
        (
            "lesson_explorer.ipynb",
            "lessons",
            {},
            [
                "45 lessons for rmsnorm on sm_90a (stored)",
                "tail elements wrong",
                "seeded",
                "rules the search applies now",
            ],
            1,
        ),
        (
            "lesson_explorer.ipynb",
            "raw",
            {"KF_ARCH": "sm_90"},
            ["45 lessons for rmsnorm on sm_90 (derived now, not stored)", "no lesson has been applied yet"],
            0,
        ),
    ],
    ids=["run_analysis", "lesson_explorer", "lesson_explorer-no-lessons"],
)
def test_notebook_runs(
    name: str,
    store: str,
    env: dict[str, str],
    expected: list[str],
    images: int,
    stores: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_STORE", str(stores[store]))
    for key in ("KF_RUN", "KF_OP", "KF_ARCH"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    text, drawn = outputs(nb)
    for want in expected:
        assert want in text
    assert drawn == images


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stripped(name: str) -> None:
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert 'os.environ.get("KF_STORE", ".kfactory/store.duckdb")' in nb.cells[1].source


_HOLD = """
import sys, time
from memory import Store
with Store.open(sys.argv[1]) as s:
    s.write_snapshot()
    print("holding", flush=True)
    time.sleep(120)
"""


def test_notebook_reads_a_store_a_run_is_writing(stores: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """While a writer holds the store (as `kfactory run` does), the notebook reads the snapshot it keeps."""
    import os
    import subprocess
    import sys

    live = tmp_path / "live.duckdb"
    shutil.copy(stores["lessons"], live)
    writer = subprocess.Popen([sys.executable, "-c", _HOLD, str(live)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "holding"
        monkeypatch.setenv("KF_STORE", str(live))
        monkeypatch.setenv("KF_RUN", fx.RUN2)
        nb = nbformat.read(REPO / "notebooks" / "run_analysis.ipynb", as_version=4)
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
        assert "analysing fx-r2 (rmsnorm on sm_90a)" in outputs(nb)[0]
        assert writer.poll() is None  # the writer held the store throughout
    finally:
        writer.kill()
        writer.wait()

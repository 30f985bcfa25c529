"""Run report: files, best per cell, geomean, best-so-far order, run-id resolution, failed runs."""

import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from evo.cli.report import (
    BEST_SO_FAR_PNG,
    CEILING_PNG,
    SPEEDUP_PNG,
    best_so_far,
    cmd_report,
    write_report,
)
from memory import BuildRow, CandidateRow, EvaluationRow, RunRow, Store, StoreError, canonical_json
from memory.results import run_evaluations

T0 = datetime(2025, 3, 4, 5, 6, 7)
CELL_A = "w=bf16,x=bf16 M4096-N1024"
CELL_B = "w=bf16,x=bf16 M4096-N8192"
FINGERPRINT = {"gpu": "NVIDIA H200", "driver": "580.159.04", "sm_clock_mhz": "1980"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# (genome, template, params) of the main run r1
GENOMES = {
    "g1": ("cta_row", {"threads": 128, "vec": 4}),
    "g2": ("cta_row", {"threads": 64, "vec": 2}),  # its WRONG_ANSWER row on CELL_A is the fastest time
    "g3": ("warp_row", {"rows_per_warp": 2, "vec": 8}),
}
# (eval_id, genome, cell, status, median_us, baseline_us, gbps, generation, seconds after T0);
# written out of evaluation order, and with ids that sort against it, on purpose: the report must
# order by generation, then time (evaluation order here: e6, e5, ..., e1).
EVALS_R1 = [
    ("e2", "g3", CELL_A, "OK", 8.0, 12.0, 3000.0, 1, 60),
    ("e1", "g3", CELL_B, "TIMEOUT", None, None, None, 1, 61),
    ("e6", "g1", CELL_A, "OK", 10.0, 12.0, 2400.0, 0, 1),
    ("e5", "g1", CELL_B, "OK", 40.0, 50.0, 3200.0, 0, 2),
    ("e4", "g2", CELL_A, "WRONG_ANSWER", 5.0, 12.0, 4800.0, 0, 3),
    ("e3", "g2", CELL_B, "OK", 45.0, 50.0, 2844.0, 0, 4),
]
CEILING = 4000.0


def run_row(run_id: str, minutes: int) -> RunRow:
    return RunRow(run_id=run_id, op="rmsnorm", arch="sm_90a", config_toml="", config_hash=f"cfg-{run_id}",
                  seed=7, status="done", created_at=T0 + timedelta(minutes=minutes))


def eval_row(eval_id: str, run_id: str, genome: str, cell: str, status: str, median_us: float | None,
             baseline_us: float | None, gbps: float | None, generation: int, seconds: int) -> EvaluationRow:
    return EvaluationRow(
        eval_id=eval_id, run_id=run_id, genome_key=genome, build_key=f"b-{genome}", cell=cell,
        dtypes_json=canonical_json({"x": "bfloat16", "w": "bfloat16"}), dims_json=canonical_json({"M": 4096}),
        status=status, median_us=median_us, baseline="torch.rms_norm", baseline_us=baseline_us,
        speedup=None if median_us is None or baseline_us is None else baseline_us / median_us,
        gbps=gbps, ceiling_gbps=CEILING, fingerprint_json=canonical_json(FINGERPRINT),
        fingerprint_class="NVIDIA H200|sm_90", generation=generation, source="replay",
        created_at=T0 + timedelta(seconds=seconds))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """r0: older, every evaluation failed; r2: no evaluations; r1: newest, the main run."""
    path = tmp_path_factory.mktemp("report") / "s.duckdb"
    rows: list = [run_row("r0", 0), run_row("r2", 5), run_row("r1", 60)]
    for key, (template, params) in GENOMES.items():
        rows.append(CandidateRow(genome_key=key, op="rmsnorm", template=template, source_hash=None,
                                 params_json=canonical_json(params), origin="init", parents_json="[]",
                                 run_id="r1", generation=0))
    rows += [BuildRow(build_key=f"b-{k}", genome_key=k, run_id="r1", arch="sm_90a", dtypes_json="{}",
                      consts_json="{}", status="OK") for k in GENOMES]
    rows.append(BuildRow(build_key="b-bad", genome_key="g1", run_id="r1", arch="sm_90a", dtypes_json="{}",
                         consts_json="{}", status="COMPILE_ERROR", error="boom"))
    rows += [eval_row(e, "r1", *rest) for e, *rest in EVALS_R1]
    rows += [eval_row("f1", "r0", "g1", CELL_A, "CRASH", None, None, None, 0, 1),
             eval_row("f2", "r0", "g2", CELL_B, "WRONG_ANSWER", 3.0, 50.0, 9000.0, 0, 2)]
    with Store.open(path) as store:
        store.write(rows)
    return path


@pytest.fixture(scope="module")
def report(store_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(store_path, "r1", tmp_path_factory.mktemp("out") / "report")


def table_row(md: str, cell: str) -> list[str]:
    """The cells of the markdown table row that starts with this cell label."""
    hits = [line for line in md.splitlines() if line.startswith(f"| {cell} |")]
    assert len(hits) == 1, f"expected one table row for {cell}, got {hits}"
    return [c.strip() for c in hits[0].strip("|").split("|")]


def expected_best() -> dict[str, tuple]:
    """Per cell, the fastest OK row of r1, computed from EVALS_R1 without the report code."""
    best: dict[str, tuple] = {}
    for row in EVALS_R1:
        _, _, cell, status, us, *_ = row
        if status == "OK" and (cell not in best or us < best[cell][4]):
            best[cell] = row
    return best


def test_writes_markdown_and_valid_pngs(report: Path) -> None:
    assert report.name == "report.md" and report.is_file()
    md = report.read_text()
    for name in (BEST_SO_FAR_PNG, SPEEDUP_PNG, CEILING_PNG):
        png = report.parent / name
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 5000, f"{name} is only {len(data)} bytes"
        assert f"]({name})" in md, f"{name} not embedded with a relative link"


def test_header_fingerprint_and_counts(report: Path) -> None:
    md = report.read_text()
    assert "r1" in md.splitlines()[0]
    for text in ("rmsnorm", "sm_90a", "cfg-r1", "NVIDIA H200", "580.159.04"):
        assert text in md, text
    assert "| OK | 4 |" in md
    assert "| WRONG_ANSWER | 1 |" in md
    assert "| TIMEOUT | 1 |" in md
    assert "| OK | 3 |" in md  # builds
    assert "| COMPILE_ERROR | 1 |" in md


def test_geomean_is_over_fastest_ok_rows(report: Path) -> None:
    md = report.read_text()
    speedups = [b[5] / b[4] for b in expected_best().values()]
    expected = math.exp(sum(map(math.log, speedups)) / len(speedups))
    assert f"Geomean speedup: {expected:.3f}" in md
    assert f"{expected:.3f}" == "1.369"  # sqrt(12/8 * 50/40): guards the fixture against silent edits


@pytest.mark.parametrize("cell", [CELL_A, CELL_B], ids=["N1024", "N8192"])
def test_per_cell_best_is_fastest_ok_row(report: Path, cell: str) -> None:
    _, genome, _, _, us, base, gbps, *_ = expected_best()[cell]
    template, params = GENOMES[genome]
    row = table_row(report.read_text(), cell)
    assert row[1] == template
    assert row[2] == "`" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + "`"
    assert row[3:] == [f"{us:.2f}", f"{base:.2f}", f"{base / us:.3f}", f"{gbps:.0f}", f"{100 * gbps / CEILING:.1f}"]


def test_faster_wrong_answer_is_not_chosen(report: Path) -> None:
    row = table_row(report.read_text(), CELL_A)
    assert "threads=64" not in row[2] and row[3] != "5.00"


def test_best_so_far_follows_evaluation_order(store_path: Path) -> None:
    with Store.open(store_path, read_only=True) as store:
        evals = run_evaluations(store, "r1")
    assert evals.cell.tolist() == [CELL_A, CELL_B, CELL_A, CELL_B, CELL_A, CELL_B]  # e6..e1
    g = math.sqrt  # over both cells from the first evaluation on, CELL_B at the baseline (1.0) until it has one
    expected = [g(1.2), g(1.2 * 1.25), g(1.2 * 1.25), g(1.2 * 1.25), g(1.5 * 1.25), g(1.5 * 1.25)]
    assert best_so_far(evals) == pytest.approx(expected)


CELL_C = "w=bf16,x=bf16 M4096-N16384"
# (genome, cell, status, median_us, baseline_us): in evaluation order; the cells get their first OK result at
# different times, CELL_C last and well below the others' geomean (which the old curve dropped to), CELL_B first
# slower than its baseline
LATE_CELL = [
    ("g1", CELL_A, "OK", 8.0, 12.0),  # 1.5
    ("g1", CELL_B, "OK", 60.0, 50.0),  # 0.83: still counted at the baseline, 1.0
    ("g1", CELL_C, "TIMEOUT", None, None),
    ("g2", CELL_A, "OK", 6.0, 12.0),  # 2.0
    ("g2", CELL_B, "OK", 40.0, 50.0),  # 1.25
    ("g3", CELL_A, "OK", 7.0, 12.0),  # slower than the best: no change
    ("g3", CELL_C, "OK", 90.0, 100.0),  # 1.11, the first result of CELL_C
    ("g3", CELL_B, "WRONG_ANSWER", 1.0, 50.0),  # faster, but wrong: no change
]


def test_best_so_far_never_goes_down_and_ends_at_the_geomean(tmp_path: Path) -> None:
    rows: list = [run_row("late", 0)]
    rows += [CandidateRow(genome_key=k, op="rmsnorm", template=t, source_hash=None, params_json=canonical_json(p),
                          origin="init", parents_json="[]", run_id="late", generation=0)
             for k, (t, p) in GENOMES.items()]
    rows += [eval_row(f"l{i}", "late", g, cell, status, us, base, None, 0, i)
             for i, (g, cell, status, us, base) in enumerate(LATE_CELL)]
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write(rows)
        curve = best_so_far(run_evaluations(store, "late"))
    assert all(b >= a for a, b in zip(curve, curve[1:])), curve
    products = [1.5, 1.5, 1.5, 2.0, 2.0 * 1.25, 2.0 * 1.25, 2.0 * 1.25 * 100 / 90, 2.0 * 1.25 * 100 / 90]
    assert curve == pytest.approx([p ** (1 / 3) for p in products])  # three cells, from the first evaluation on
    md = write_report(tmp_path / "s.duckdb", "late", tmp_path / "out").read_text()
    assert f"**Geomean speedup: {curve[-1]:.3f} over 3 of 3 cells" in md  # every cell has a result: the same number
    assert ("after each evaluation, the geomean over all 3 cells of the run of each cell's best speedup so far, a "
            "cell counting at the baseline (1.0) until it has an OK result faster than the baseline") in md


def test_unknown_run_id_names_it_and_lists_known(store_path: Path, tmp_path: Path) -> None:
    with pytest.raises(KeyError) as e:
        write_report(store_path, "nope", tmp_path)
    msg = str(e.value)
    assert "nope" in msg and all(r in msg for r in ("r0", "r1", "r2"))
    assert not (tmp_path / "report.md").exists()


def test_latest_is_newest_run_in_default_folder(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_report(store_path, "latest", None) == 0
    md = store_path.parent / "runs" / "r1" / "report" / "report.md"
    assert md.is_file() and "# Run report: r1" in md.read_text()
    assert str(md) in capsys.readouterr().out


def test_cmd_report_explicit_out(store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_report(store_path, "r1", tmp_path / "x") == 0
    assert (tmp_path / "x" / "report.md").is_file()
    assert str(tmp_path / "x" / "report.md") in capsys.readouterr().out


def test_cmd_report_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store"):
        cmd_report(tmp_path / "none.duckdb", "latest", None)


@pytest.mark.parametrize("run_id", ["r0", "r2"], ids=["all-failed", "no-evaluations"])
def test_run_without_ok_evaluation_still_reports(store_path: Path, tmp_path: Path, run_id: str) -> None:
    (tmp_path / SPEEDUP_PNG).write_bytes(b"stale")  # from an earlier report into the same folder
    md = write_report(store_path, run_id, tmp_path).read_text()
    assert f"# Run report: {run_id}" in md
    assert "No OK evaluation in this run" in md
    assert "Geomean" not in md and ".png)" not in md
    assert not list(tmp_path.glob("*.png"))
    if run_id == "r0":
        assert "| CRASH | 1 |" in md and "| WRONG_ANSWER | 1 |" in md
    else:
        assert "No evaluations." in md

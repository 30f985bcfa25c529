"""Warm reruns: builds come back from the store (same build key, no NVRTC), results are never measured twice,
the dispatch table is never worse than what the store held, and the report counts reused against measured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evo.build.nvrtc import Builder, BuildResult
from evo.cli.main import main
from evo.core.config import parse_config
from evo.core.genome import Genome
from evo.core.status import Status
from evo.loop.pipeline import Session, build, stored_builds
from evo.templates.template import parse_template
from memory import Store
from tests.unit.test_render_build import HEADER
from tests.unit.test_search_replay import SMALL
from tests.unit.test_store import build_row

BROKEN = HEADER.replace('name = "evil"', 'name = "broken"') + (
    'extern "C" __global__ void k(float* x) { this is not C++ }\n')


def _session(store: Store, run_id: str) -> Session:
    s = Session(parse_config(SMALL.replace("{gens}", "2")), store, run_id, log=lambda _: None)
    s.templates["broken"] = parse_template(BROKEN, "test")
    return s


def _genomes(s: Session) -> list[Genome]:
    out = [Genome.make("rmsnorm", t.name, t.source_hash, t.default_params()) for t in s.templates.values()]
    assert {g.template for g in out} == {"warp_row", "cta_row", "broken"}
    return out


def test_a_second_session_reads_builds_back_from_the_store_and_compiles_nothing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        first = _session(store, "one")
        with Builder(workers=1) as b:
            result1 = build(first, b, _genomes(first), 0)
            assert b.compiled == result1.compiled > 0 and result1.reused == 0
        store.write(result1.rows)  # what the loop's writer does with the generation
        second = _session(store, "two")
        with Builder(workers=1) as b:
            result2 = build(second, b, _genomes(second), 0)
            assert b.compiled == 0 and result2.compiled == 0
        store.write(result2.rows)
        built1, built2 = result1.cells, result2.cells
        keys = {r.build_key for pairs in built1.values() for _, r in pairs}
        assert result2.reused == len(keys) >= 3
        by_key1 = {r.build_key: r for pairs in built1.values() for _, r in pairs}
        for pairs in built2.values():
            for _, r in pairs:
                a = by_key1[r.build_key]
                assert (r.status, r.cubin, r.resources, r.error) == (a.status, a.cubin, a.resources, a.error)
        statuses = {g: {r.status for _, r in pairs} for g, pairs in built2.items()}
        assert Status.COMPILE_ERROR in statuses[_genomes(second)[-1].key()] or \
            any(Status.COMPILE_ERROR in v for v in statuses.values())  # NVRTC's own error comes back too
        ok = [r for pairs in built2.values() for _, r in pairs if r.status is Status.OK]
        assert ok and all(r.cubin[:4] == b"\x7fELF" and r.regs > 0 for r in ok)
        # the builds table keeps the first run's rows; the second added none
        assert store.sql("SELECT count(*) AS n FROM builds WHERE run_id = 'two'").n[0] == 0


def test_only_failures_that_are_the_sources_fault_are_reused(tmp_path: Path) -> None:
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Used 40 registers, 16 bytes smem\n")
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write([
            build_row("ok", log=log, cubin=b"\x7fELFok"),
            build_row("nvrtc", status="COMPILE_ERROR", log="x.cu(3): error: expected a ';'", cubin=None),
            build_row("timeout", status="COMPILE_ERROR", log="", error="NVRTC compile exceeded 60 s", cubin=None),
            build_row("died", status="COMPILE_ERROR", log=None, error="the compiler process died", cubin=None),
            build_row("render", status="RENDER_ERROR", log="", cubin=None),
            build_row("resource", status="RESOURCE_ERROR", log=log, cubin=b"\x7fELFr"),
            build_row("no-cubin", log=log, cubin=None),
        ])
        got = {r.build_key: r for r in stored_builds(store, ["ok", "nvrtc", "timeout", "died", "render", "resource",
                                                             "no-cubin", "absent"])}
    assert set(got) == {"ok", "nvrtc", "resource"}
    assert got["ok"].cubin == b"\x7fELFok" and got["ok"].regs == 40 and got["ok"].smem_bytes == 16
    assert dict(got["ok"].resources)["k"].regs == 40
    assert got["nvrtc"].status is Status.COMPILE_ERROR and got["nvrtc"].log.startswith("x.cu(3)")
    b = Builder(workers=1)
    b.remember(got.values())
    b.remember([BuildResult("ok", Status.COMPILE_ERROR)])  # a key already known keeps its result
    assert b.has("ok") and not b.has("timeout") and b.build([])[:0] == []


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run 'full' searches 4 generations; run 'short' (same seed, one generation) then runs on its store:
    its one generation is full's first, so it reuses everything and finds only what full found first."""
    tmp = tmp_path_factory.mktemp("reuse")
    store = tmp / "s.duckdb"
    full = tmp / "full.toml"
    full.write_text(SMALL.replace("{gens}", "4"))
    short = tmp / "short.toml"
    short.write_text(SMALL.replace("{gens}", "1"))
    assert main(["run", str(full), "--store", str(store), "--run-id", "full"]) == 0
    assert main(["run", str(short), "--store", str(store), "--run-id", "short"]) == 0
    return store


def test_a_rerun_never_ends_worse_than_the_store(two_runs: Path) -> None:
    with Store.open(two_runs, read_only=True) as s:
        store_best = s.sql("SELECT cell, min(median_us) AS us FROM evaluations WHERE status = 'OK' AND run_id = 'full' "
                           "GROUP BY cell").set_index("cell").us.to_dict()
        own_best = s.sql("SELECT cell, min(median_us) AS us FROM evaluations WHERE status = 'OK' AND run_id = 'short' "
                         "GROUP BY cell").set_index("cell").us.to_dict()
    table = json.loads((two_runs.parent / "runs" / "short" / "dispatch.json").read_text())["dispatch"]
    assert set(table) == set(store_best)
    for cell, us in store_best.items():
        assert table[cell]["median_us"] == pytest.approx(us)
    # not vacuous: on some cell the short run alone found worse than the store held, and the table says whence
    worse = [c for c in store_best if own_best.get(c, float("inf")) > store_best[c]]
    assert worse and all(table[c]["measured_in"] == "full" for c in worse)


def test_the_report_counts_reused_against_measured(two_runs: Path, tmp_path: Path) -> None:
    assert main(["report", "short", "--store", str(two_runs), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    with Store.open(two_runs, read_only=True) as s:
        n, reused = s.sql("SELECT count(*), count(reused_from) FROM evaluations WHERE run_id = 'short'").iloc[0]
        used, compiled = s.sql(
            "SELECT count(DISTINCT e.build_key), count(DISTINCT e.build_key) FILTER (WHERE b.run_id = 'short') "
            "FROM evaluations e LEFT JOIN builds b USING (build_key) WHERE e.run_id = 'short'").iloc[0]
        genomes = s.sql("SELECT count(DISTINCT genome_key) FROM evaluations WHERE run_id = 'short'").iloc[0, 0]
    assert reused > 0 and used > 0 and compiled == 0
    assert f"| evaluations | {n}: {n - reused} measured, {reused} reused from earlier runs' measurements" in md
    assert f"| builds | {used} used: {compiled} compiled in this run, {used - compiled} reused from the store |" in md
    assert re.search(rf"\| candidates \| {genomes} genomes over 1 generation\(s\) \|", md)
    assert genomes > 0  # a rerun's genomes were first proposed by another run: still counted as its own


def test_a_stored_build_without_a_ptxas_report_gets_its_registers_from_its_cubin(tmp_path: Path) -> None:
    """A build recorded with no ptxas report (some cuda.core releases give none) reads back with the registers
    its cubin's .nv.info holds, not 0."""
    with Store.open(tmp_path / "s.duckdb") as store:
        first = _session(store, "one")
        g = next(g for g in _genomes(first) if g.template == "warp_row")
        with Builder(workers=1) as b:
            made = build(first, b, [g], 0)
        ok = [r for pairs in made.cells.values() for _, r in pairs if r.status is Status.OK]
        assert ok and all(r.regs > 0 for r in ok)
        store.write([build_row(r.build_key, genome_key=g.key(), log=None, cubin=r.cubin, regs=None)
                     for r in {r.build_key: r for r in ok}.values()])
        back = {r.build_key: r for r in stored_builds(store, [r.build_key for r in ok])}
        for r in ok:
            assert back[r.build_key].regs == r.regs
            assert {k: x.regs for k, x in back[r.build_key].resources} == {k: x.regs for k, x in r.resources}


def test_a_run_with_a_spill_limit_refuses_the_builds_that_spill_more_and_stores_them_as_compiled(tmp_path: Path):
    """build.max_spill_bytes: a build whose kernels spill more is a RESOURCE_ERROR on every cell in this run (never
    timed); one at the limit is OK; the store keeps both builds as compiled (a run without the limit times them)."""
    from evo.build.nvrtc import KernelResources

    text = SMALL.replace("{gens}", "2").replace("[build]\n", "[build]\nmax_spill_bytes = 8\n", 1)
    assert "max_spill_bytes = 8" in text
    with Store.open(tmp_path / "s.duckdb") as store:
        s = Session(parse_config(text), store, "spills", log=lambda _: None)
        genomes = [Genome.make("rmsnorm", t.name, t.source_hash, t.default_params()) for t in s.templates.values()]
        spills = {"warp_row": 9, "cta_row": 8}
        cached = {bi.key(): BuildResult(bi.key(), Status.OK, (("k", KernelResources(regs=255,
                                                                                    spill_stores=spills[g.template],
                                                                                    spill_loads=4)),), b"\x7fELF")
                  for g in genomes for _, bi in s.build_inputs(g)}
        with Builder(workers=1, cached=cached) as b:
            result = build(s, b, genomes, 0)
            assert b.compiled == 0
    by_template = {g.template: {r.status for _, r in result.cells[g.key()]} for g in genomes}
    assert by_template == {"warp_row": {Status.RESOURCE_ERROR}, "cta_row": {Status.OK}}
    refused = result.cells[genomes[[g.template for g in genomes].index("warp_row")].key()][0][1]
    assert refused.error == "spills 9 B stored, 4 B loaded > build.max_spill_bytes 8"
    assert {r.status for r in result.rows if hasattr(r, "spill_stores")} == {"OK"}

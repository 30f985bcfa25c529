"""`kfactory bench --dispatch/--cells/--peer`, the peers table script, and the matrix filtered by dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.cli.bench import dispatch_plan
from evo.cli.errors import UnknownNameError
from evo.cli.main import main
from evo.core.config import ConfigError, load_config
from evo.loop.pipeline import cells_for
from evo.templates.template import load_templates
from evo.core.registry import get_op

ROOT = Path(__file__).resolve().parents[2]
REGIMES = ROOT / "tests/fixtures/results/rmsnorm_h200_regimes/dispatch.json"


def test_dispatch_plan_rebuilds_every_entry_on_its_own_cell():
    op = get_op("rmsnorm")
    plan = dispatch_plan(op, load_templates("rmsnorm"), REGIMES)
    table = json.loads(REGIMES.read_text())["dispatch"]
    assert len(plan) == len(table) == 36
    for (cands, cells) in plan:
        ((label, tdef, genome),) = cands
        (cell,) = cells
        entry = table[cell.label()]
        assert genome.key() == entry["genome_key"] and tdef.name == entry["template"]  # today's text = the run's
        assert label == f"{tdef.name}:{genome.key()[:8]}"
    sizes = [op.bytes_moved(cells[0]) for _, cells in plan]  # smallest first: a bench cut short keeps the most rows
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


KDA_13 = ROOT / "tests/fixtures/results/kda_prefill_h200_13/dispatch.json"


def test_dispatch_plan_runs_a_table_recorded_before_a_param_existed():
    """kda_prefill_h200_13's entries predate prep_addr and overlap: they run with those at their defaults (the
    code as it was), legal on their cells (a bench that checked the current space alone refused all four: "no legal point")."""
    op, tdefs = get_op("kda"), load_templates("kda")
    table = json.loads(KDA_13.read_text())["dispatch"]
    t = tdefs["chunk"]
    lacking = {k for e in table.values() for k in t.param_names if k not in e["params"]}
    assert {"prep_addr", "overlap"} <= lacking  # the case this test is about
    plan = dispatch_plan(op, tdefs, KDA_13)
    assert len(plan) == len(table) == 4
    for ((_, tdef, genome),), (cell,) in plan:
        params = genome.params_dict()
        assert params == t.default_params() | table[cell.label()]["params"]
        assert tdef.violations(params, 90, cell.dtypes_dict(), cell.dims_dict()) == []


def test_dispatch_plan_names_a_param_the_template_no_longer_has(tmp_path):
    d = json.loads(KDA_13.read_text())
    label = next(iter(d["dispatch"]))
    d["dispatch"][label]["params"]["prep_gone"] = 1
    p = tmp_path / "dispatch.json"
    p.write_text(json.dumps(d))
    with pytest.raises(UnknownNameError, match=f"entry '{label}'.*no longer has param.*'prep_gone'"):
        dispatch_plan(get_op("kda"), load_templates("kda"), p)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["dispatch"].update({"x=bf16,w=bf16 M7-N7": next(iter(d["dispatch"].values()))}), "not in op rmsnorm's matrices"),
    (lambda d: next(iter(d["dispatch"].values())).update(template="gone"), "template 'gone'"),
    (lambda d: d.pop("dispatch"), "not a dispatch table"),
], ids=["unknown-cell", "unknown-template", "no-table"])
def test_dispatch_plan_errors_name_the_problem(tmp_path, edit, match):
    d = json.loads(REGIMES.read_text())
    edit(d)
    p = tmp_path / "dispatch.json"
    p.write_text(json.dumps(d))
    with pytest.raises(UnknownNameError, match=match):
        dispatch_plan(get_op("rmsnorm"), load_templates("rmsnorm"), p)


@pytest.mark.parametrize("args, match", [
    (["--cells", "("], "not a regular expression"),
    (["--cells", "x=int8"], "matches no cell"),
    (["--peer", "nope"], "declares no baseline"),
], ids=["bad-regex", "no-cell", "unknown-peer"])
def test_bench_user_errors_are_one_line(capsys, args, match):
    rc = main(["bench", "--op", "rmsnorm", "--dispatch", str(REGIMES), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and match in err and len(err.splitlines()) == 1


def test_bench_without_gpu_says_so(capsys, monkeypatch):
    monkeypatch.setattr("evo.cli.bench.gpu_available", lambda: False)
    rc = main(["bench", "--op", "rmsnorm", "--dispatch", str(REGIMES), "--cells", "x=bf16 M4096-N1024$",
               "--peer", "quack"])
    assert rc == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err


def test_matrix_filtered_by_dtype(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nop = "rmsnorm_bwd"\nrunner = "gpu"\n'
                   '[cells]\nmatrix = true\ndtypes = ["bf16"]\n')
    cells = cells_for(load_config(cfg), get_op("rmsnorm_bwd"))
    assert len(cells) == 7 and {c.dtype("x").short for c in cells} == {"bf16"}
    assert cells == [c for c in get_op("rmsnorm_bwd").matrix() if c.dtype("x").short == "bf16"]


class _CapturingRunner:
    fingerprint = {"gpu": "none"}
    ceiling_gbps = 4000.0

    def __init__(self) -> None:
        self.jobs: list = []

    def run(self, jobs):
        from evo.measure.jobs import JobResult

        self.jobs += jobs
        return [JobResult(j.job_id, "launch", "not run: captured") for j in jobs]


@pytest.mark.parametrize("text, timed", [("", True), ("baseline = false\n", False)], ids=["default", "off"])
def test_search_may_leave_the_baseline_out(tmp_path, text, timed):
    """eval.baseline = false: the search's jobs time no peer beside the candidate (the peers are timed
    afterwards on the dispatch table); by default the op's first baseline is timed beside each."""
    from evo.build.nvrtc import compile_one, prepare
    from evo.core.genome import Genome
    from evo.measure.evaluators import EvalItem, GpuEvaluator
    from evo.measure.jobs import Timing
    from ops.rmsnorm.spec import cell

    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nop = "rmsnorm"\nrunner = "gpu"\n[eval]\n' + text)
    c = load_config(cfg)
    assert c.eval.baseline is timed
    tdef = load_templates("rmsnorm")["cta_row"]
    g = Genome.make("rmsnorm", "cta_row", tdef.source_hash, tdef.default_params())
    x = cell("bf16", 64, 4096)
    b = compile_one(prepare(tdef, g, "sm_90a", x.dtypes_dict(), x.dims_dict()))
    runner = _CapturingRunner()
    (o,) = GpuEvaluator(get_op("rmsnorm"), 90, runner, Timing(), 0, baseline=c.eval.baseline).evaluate(
        [EvalItem(g, tdef, x, b)])
    (job,) = runner.jobs
    assert job.baseline is timed and o.status.value == "LAUNCH_ERROR"


def test_a_config_picks_a_named_matrix(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nop = "rmsnorm"\nrunner = "gpu"\n[cells]\nmatrix = "residual"\ndtypes = ["fp16"]\n')
    op = get_op("rmsnorm")
    cells = cells_for(load_config(cfg), op)
    assert cells and all(c.dtype("x").short == "fp16" and "residual" in c.dtypes_dict() for c in cells)
    assert cells == [c for c in op.matrices["residual"]() if c.dtype("x").short == "fp16"]
    cfg.write_text('[run]\nop = "rmsnorm"\nrunner = "gpu"\n[cells]\nmatrix = "nope"\n')
    with pytest.raises(ConfigError, match="no matrix named 'nope'.*residual"):
        cells_for(load_config(cfg), op)
    cfg.write_text('[run]\nop = "rmsnorm"\nrunner = "gpu"\n[cells]\nmatrix = 3\n')
    with pytest.raises(ConfigError, match="cells.matrix: expected bool or str"):
        load_config(cfg)


def test_cells_only_keeps_the_cells_its_expression_finds(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nop = "rmsnorm_bwd"\nrunner = "gpu"\n[cells]\nmatrix = true\nonly = "N262144|fp16.* M16384"\n')
    op = get_op("rmsnorm_bwd")
    cells = cells_for(load_config(cfg), op)
    labels = {c.label() for c in cells}
    assert labels == {"w=bf16,x=bf16 M8192-N262144", "w=fp16,x=fp16 M8192-N262144", "w=fp16,x=fp16 M16384-N131072"}
    assert cells == [c for c in op.matrix() if c.label() in labels]  # the matrix's order, nothing added
    cfg.write_text('[run]\nop = "rmsnorm_bwd"\nrunner = "gpu"\n[cells]\nmatrix = true\nonly = "N333"\n')
    with pytest.raises(ConfigError, match="cells.only: 'N333' matches none of the 18 cells"):
        cells_for(load_config(cfg), op)
    cfg.write_text('[run]\nop = "rmsnorm_bwd"\nrunner = "gpu"\n[cells]\nmatrix = true\nonly = "N(262144"\n')
    with pytest.raises(ConfigError, match="cells.only: 'N\\(262144' is not a regular expression"):
        load_config(cfg)


def test_residual_experiment_builds_through_kfactory_run(tmp_path, capsys, monkeypatch):
    """The residual variant runs through the engine unchanged: real NVRTC builds of cta_row_fused on its
    13 cells, recorded in a real store (no GPU here: it stops before evaluating)."""
    monkeypatch.setattr("evo.measure.run.gpu_available", lambda: False)
    store = tmp_path / "s.duckdb"
    rc = main(["run", str(ROOT / "experiments" / "rmsnorm_residual_h200.toml"), "--store", str(store)])
    assert rc == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err
    rc = main(["sql", "SELECT count(*) FILTER (WHERE b.status = 'OK') AS ok, count(*) AS n FROM builds b "
               "JOIN candidates c USING (genome_key) WHERE c.template = 'cta_row_fused'", "--store", str(store)])
    ok, n = map(int, capsys.readouterr().out.split()[-2:])
    assert ok >= 13 and ok == n


class _OkRunner(_CapturingRunner):
    """Answers every job with one passing check (no timing): judged OK."""

    def run(self, jobs):
        from evo.measure.jobs import CheckStats, JobResult

        self.jobs += jobs
        ok = CheckStats("y", 1, 0, 0, 0, 0, -1, 0.0, 0.0, 0)
        return [JobResult(j.job_id, checks=(("kind normal", (ok,)),)) for j in jobs]


def test_gate_cells_run_once_per_build():
    """Two cells sharing a build (the same N at another M) share their gate cells: the second job runs
    none of the shapes the first passed (M = 1 is drawn for both); a cell of another N runs its own."""
    from evo.build.nvrtc import compile_one, prepare
    from evo.core.genome import Genome
    from evo.measure.evaluators import EvalItem, GpuEvaluator
    from evo.measure.jobs import Timing
    from ops.rmsnorm.spec import cell

    tdef = load_templates("rmsnorm")["warp_row"]  # N is a runtime argument: one build for every N
    g = Genome.make("rmsnorm", "warp_row", tdef.source_hash, tdef.default_params())
    a, b = cell("bf16", 4096, 4096), cell("bf16", 32768, 4096)
    build = compile_one(prepare(tdef, g, "sm_90a", a.dtypes_dict(), a.dims_dict()))
    runner = _OkRunner()
    ev = GpuEvaluator(get_op("rmsnorm"), 90, runner, Timing(), 0)
    (oa,) = ev.evaluate([EvalItem(g, tdef, a, build)])
    assert oa.status.value == "OK" and runner.jobs[0].gate
    (ob,) = ev.evaluate([EvalItem(g, tdef, b, build)])
    ran = [{gc.dims for gc in j.gate} for j in runner.jobs]  # the shapes each job ran (drawn per job)
    assert ob.status.value == "OK" and not ran[0] & ran[1]
    one_row = (("M", 1), ("N", 4096))  # drawn for every job: run for a, not again for b
    assert one_row in ran[0] and one_row not in ran[1]

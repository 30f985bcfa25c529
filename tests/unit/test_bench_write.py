"""kfactory bench's files: every named peer, the best one per cell, and the absent ones by name."""

from __future__ import annotations

import csv
import json

from evo.cli.bench import CSV_COLUMNS, BenchRow, write
from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from ops.rmsnorm.spec import cell as rms_cell

G = Genome.make("rmsnorm", "cta_row", "h", {"threads": 256})


def row(m: int, us: float, peers: dict, absent: dict) -> BenchRow:
    c = rms_cell("bf16", m, 1024)
    o = Outcome(G, c, Status.OK, "b", median_us=us, p10_us=us, p90_us=us, samples=100,
                baseline_us=peers["torch.rms_norm"], baseline="torch.rms_norm", peers=tuple(peers.items()),
                absent=tuple(absent.items()), peers_checked=tuple((n, "ok at 2 x tolerance: y rel norm err 0.001 <= 0.016")
                                                                  for n in peers))
    return BenchRow("cta_row", "cta_row", c, "bf16", o, 40, 4 * m * 1024, 4200.0)


def test_bench_files_name_every_peer(tmp_path):
    rows = [row(64, 10.0, {"torch.rms_norm": 20.0, "quack": 9.0}, {"liger": "not installed: No module named 'liger_kernel'"}),
            row(128, 5.0, {"torch.rms_norm": 6.0, "quack": 5.5}, {"liger": "not installed: No module named 'liger_kernel'"})]
    write(rows, tmp_path / "b", {"gpu": "H200"}, 4200.0)
    got = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert tuple(got[0]) == CSV_COLUMNS
    assert [r["best_peer"] for r in got] == ["quack", "quack"]
    assert json.loads(got[0]["peers"]) == {"torch.rms_norm": 20.0, "quack": 9.0}
    assert set(json.loads(got[0]["peers_checked"])) == {"torch.rms_norm", "quack"}  # every timed peer was checked
    assert float(got[0]["speedup"]) == 2.0 and abs(float(got[0]["gbps"]) - 4 * 64 * 1024 / 10e-6 / 1e9) < 1e-9
    summary = json.loads((tmp_path / "b.json").read_text())["summary"]["cta_row"]
    assert summary["cells_at_or_above_best_peer"] == 1  # 9/10 < 1 on a, 5.5/5 >= 1 on b
    assert abs(summary["geomean_speedup_vs_best_peer"] - (0.9 * 1.1) ** 0.5) < 1e-9
    md = (tmp_path / "b.md").read_text()
    assert "liger: not installed" in md and "| quack |" in md


class _Runner:
    """A runner that answers every job with fixed measurements: bench's mapping, without a GPU."""

    fingerprint = {"gpu": "fake"}
    ceiling_gbps = 4000.0

    def __init__(self) -> None:
        self.jobs = []

    def run(self, jobs):
        from evo.measure.jobs import CheckStats, JobResult

        self.jobs += list(jobs)
        ok = CheckStats("y", 1, 0, 0, 0, 0, -1, 0.0, 0.0, 0)
        return [JobResult(j.job_id, checks=(("kind normal", (ok,)),), times_us=(10.0,) * 5,
                          baseline_us=(20.0,) * 5, baseline_name="torch.rms_norm",
                          peers=(("torch.rms_norm", (20.0,) * 5), ("quack", (9.0,) * 5)),
                          absent=(("liger", "not installed: No module named 'liger_kernel'"),),
                          ceiling_gbps=4000.0, bytes_moved=j.bytes_moved) for j in jobs]


def test_bench_times_through_the_evaluator_with_every_peer(tmp_path):
    from evo.cli.bench import bench
    from evo.measure.jobs import Timing
    from evo.templates.template import load_templates
    from evo.core.registry import get_op
    from ops.rmsnorm.spec import cell

    op = get_op("rmsnorm")
    runner = _Runner()
    rows = bench(op, [("cta_row", load_templates("rmsnorm")["cta_row"], None)], [cell("bf16", 64, 1024)], "sm_90a",
                 runner, Timing())
    (r,) = rows
    assert r.status == "OK" and r.best_peer[0] == "quack" and abs(r.speedup_vs_best_peer - 0.9) < 1e-12
    assert r.speedup == 2.0 and dict(r.outcome.absent) == {"liger": "not installed: No module named 'liger_kernel'"}
    (job,) = runner.jobs
    assert job.baselines == op.baselines  # every declared peer asked for
    assert job.gate and all(dict(gc.dims)["N"] == 1024 for gc in job.gate)  # the evaluator's gate cells came along


def test_bench_method_names_the_l2_flush_its_fingerprint_records(tmp_path):
    rows = [row(64, 10.0, {"torch.rms_norm": 20.0}, {})]
    for fp, words in (({"gpu": "H200", "l2_flush": "read"}, "reading 256 MiB"),
                      ({"gpu": "H200", "l2_flush": "write"}, "a 256 MiB memset"),
                      ({"gpu": "H200"}, "a 256 MiB memset")):  # a fingerprint from before the key: the memset
        write(rows, tmp_path / "b", fp, 4200.0)
        assert f"flushed before each (by {words}" in json.loads((tmp_path / "b.json").read_text())["method"]


def test_bench_names_the_constraints_a_given_point_breaks_on_a_cell(tmp_path):
    """A given point illegal on a cell is never built or timed, and its row says which constraints refused it."""
    from evo.cli.bench import bench
    from evo.measure.jobs import Timing
    from evo.templates.template import load_templates
    from evo.core.registry import get_op
    from ops.rmsnorm.spec import cell

    op, t = get_op("rmsnorm"), load_templates("rmsnorm")["cta_row"]
    c = cell("bf16", 64, 1024)
    bad = t.default_params()  # 256 threads of 8-element vectors over a 1024-element row: idle warps
    broken = t.violations(bad, 90, c.dtypes_dict(), c.dims_dict())
    assert broken and t.is_valid(bad, 90, c.dtypes_dict(), {"M": 64, "N": 4096})
    runner = _Runner()
    (r,) = bench(op, [("cta_row", t, Genome.make("rmsnorm", t.name, t.source_hash, bad))], [c], "sm_90a", runner, Timing())
    assert runner.jobs == [] and r.status == "INVALID"
    write([r], tmp_path / "b", {"gpu": "fake"}, 4000.0)
    (got,) = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert got["error"] == f"the point breaks {', '.join(broken)} here"

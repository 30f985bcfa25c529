"""`kfactory profile` (evo/tools/profile/) on the CPU: the committed targets resolve to legal plans that
NVRTC builds at sm_90a, the ncu command line profiles exactly one round of the plan's kernels after the
checked one with the clocks left alone, ncu's CSV is read into per-kernel metrics and stall reasons, and
a machine without ncu gets a logged failure per target, not a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.tools.profile import ncu as N
from evo.tools.profile import targets as P
from evo.tools.profile.runner import profile_targets

ROOT = Path(__file__).resolve().parents[2]

TARGETS = ROOT / "experiments" / "profile_h200.toml"


def test_committed_targets_plan_and_build():
    ts = P.load_targets(TARGETS)
    assert {t.op for t in ts} == {"rmsnorm", "rmsnorm_bwd"}
    for t in ts:
        _, job, c = P.plan(t)
        assert c.label() == t.cell and job.launches
        b = P.build(t)
        assert b.status.ok and {k for k, _ in b.resources} == {lj.kernel for lj in job.launches}
        assert all(r.spill_stores == 0 for _, r in b.resources), t.name


def test_the_kda_carry_targets_take_the_carry_table_and_build_spill_free():
    """experiments/profile_kda_carry.toml: the carry dispatch on two prefill cells (B1-T8192, B8-T2048)."""
    ts = P.load_targets(ROOT / "experiments" / "profile_kda_carry.toml")
    table = json.loads((ROOT / "experiments/seeds/kda_prefill_carry.json").read_text())["dispatch"]
    assert {t.cell.split()[1].split("-K")[0] for t in ts} == {"B1-H32-HV32", "B8-H16-HV16"}
    for t in ts:
        assert (t.template, t.params) == (table[t.cell]["template"], table[t.cell]["params"])
        assert t.params["recur_addr"] == "carry"
        b = P.build(t)
        assert b.status.ok and {k for k, _ in b.resources} == {"kda_chunk_prep", "kda_chunk_recur"}
        assert all(r.spill_stores == 0 for _, r in b.resources), t.name


def test_a_dispatch_target_takes_the_entry_of_its_cell():
    t = next(t for t in P.load_targets(TARGETS) if t.name == "rmsnorm_bwd_bf16_M32768N4096")
    entry = json.loads((ROOT / "tests/fixtures/results/rmsnorm_bwd_h200_all3/dispatch.json").read_text())["dispatch"][t.cell]
    assert (t.template, t.params) == (entry["template"], entry["params"])


@pytest.mark.parametrize("body, words", [
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ntemplate = "cta_row"\n', "needs a string 'cell'"),
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ntemplate = "cta_row"\ncell = "w=bf16,x=bf16 M3-N5"\n', "is not one of"),
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ncell = "w=bf16,x=bf16 M4096-N1024"\n', "needs template"),
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ncell = "w=bf16,x=bf16 M4096-N1024"\ndispatch = "d.json"\n', "has no entry"),
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ntemplate = "cta_row"\nparams = { threads = 128 }\n'
     'cell = "w=bf16,x=bf16 M4096-N1024"\n' * 2,
     "target names repeat"),
    ("", "no \\[\\[target\\]\\]"),
    ('[[target]]\nname = "a"\nop = "rmsnorm"\ntemplate = "cta_row"\ncell = "w=bf16,x=bf16 M4096-N1024"\n', "no_idle_warps"),
])
def test_bad_targets_are_refused_by_name(tmp_path, body, words):
    (tmp_path / "d.json").write_text(json.dumps({"dispatch": {}}))
    p = tmp_path / "t.toml"
    p.write_text(body)
    with pytest.raises(ValueError, match=words):
        P.load_targets(p)


def test_ncu_command_profiles_one_round_after_the_checked_one():
    t = P.load_targets(ROOT / "experiments" / "profile_kda_carry.toml")[0]
    cmd = N.ncu_command(t, ["kda_chunk_prep", "kda_chunk_recur"], times=2)
    assert cmd[0] == "ncu" and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:^(kda_chunk_prep|kda_chunk_recur)"
    assert cmd[cmd.index("--launch-skip") + 1] == cmd[cmd.index("--launch-count") + 1] == "2"
    assert "--metrics" in cmd and "--metrics" not in N.ncu_command(t, ["k"], 2, stalls=False)
    assert "InstructionStats" in cmd and any("bank_conflicts" in a for a in cmd)
    assert cmd[cmd.index("evo.cli.main") + 1:cmd.index("evo.cli.main") + 3] == ["profile", "run"]
    tail = cmd[cmd.index("run"):]
    assert json.loads(tail[tail.index("--params") + 1]) == t.params and tail[tail.index("--cell") + 1] == t.cell


NCU_CSV = '''==PROF== Connected to process 1 (python3)
==PROF== Profiling "kda_chunk_prep" - 0: 0%....50%....100% - 38 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","774.40"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","21.5"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Compute Workload Analysis","Issue Slots Busy","%","81.2"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Launch Statistics","Registers Per Thread","register/thread","80"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Instruction Statistics","Executed Instructions","inst","541,065,216"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Command line profiler metrics","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","","1,234"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","","1.5"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","","0.25"
"0","1","python3","h","kda_chunk_prep","1","7","(256, 1, 1)","(256, 32, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio","","2.75"
"1","1","python3","h","kda_chunk_recur","1","7","(64, 1, 1)","(2, 32, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","ms","1,066.20"
==PROF== Disconnected from process 1
'''


def test_ncu_csv_is_read_per_kernel_with_stalls_largest_first(tmp_path):
    ks = N.parse_ncu_csv(NCU_CSV)
    assert [k["kernel"] for k in ks] == ["kda_chunk_prep", "kda_chunk_recur"]
    prep, recur = ks
    assert prep["metrics"]["duration"] == {"value": 774.4, "unit": "us"}
    assert prep["metrics"]["issue_busy_pct"]["value"] == 81.2 and prep["metrics"]["registers"]["value"] == 80
    assert list(prep["stalls"]) == ["math_pipe_throttle", "barrier", "long_scoreboard"]
    assert prep["metrics"]["instructions"] == {"value": 541065216.0, "unit": "inst"}
    assert prep["metrics"]["smem_ld_conflicts"]["value"] == 1234.0  # a raw counter, not a stall
    assert recur["metrics"]["duration"] == {"value": 1066.2, "unit": "ms"} and recur["grid"] == "(2, 32, 1)"
    (tmp_path / "kda.csv").write_text(NCU_CSV)
    summary = N.summarize(tmp_path)
    assert summary["kda"] == ks
    md = (tmp_path / "summary.md").read_text()
    assert "| kda | kda_chunk_prep | 774 us | 21.5 % |" in md and "math_pipe_throttle 2.75" in md


def test_without_ncu_each_target_logs_its_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu on it
    p = tmp_path / "t.toml"
    p.write_text('[[target]]\nname = "fwd"\nop = "rmsnorm"\ntemplate = "cta_row"\nparams = { threads = 128 }\n'
                 'cell = "w=bf16,x=bf16 M4096-N1024"\n')
    assert profile_targets(P.load_targets(p), tmp_path / "out") == 0
    log = (tmp_path / "out" / "fwd.log").read_text()
    assert log.count("rc=-1") == 2 and "ncu" in log  # with the stall metrics, then without
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == {}
    assert main(["profile", "targets", str(p), str(tmp_path / "out2")]) == 1  # none profiled


def test_a_bad_targets_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["profile", "targets", str(tmp_path / "none.toml"), str(tmp_path / "out")]) == 2
    assert "no targets file at" in capsys.readouterr().err
    assert main(["profile", "run", "--op", "rmsnorm", "--template", "cta_row", "--cell", "x", "--params", "{"]) == 2
    assert "--params is not JSON" in capsys.readouterr().err

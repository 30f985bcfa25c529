"""Nsight Compute's side of profiling: the command line over one target (its kernels only, the checked first round
skipped, one round profiled, clocks left alone), and its `--csv --page details` output read into per-kernel
metrics and warp-stall reasons, with a markdown summary."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from evo.tools.profile.targets import Target

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "InstructionStats")
STALLS = r"regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
# (section, metric) -> short name in the summary
KEEP = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_pct",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "memory_pct",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_pct",
    ("Occupancy", "Theoretical Occupancy"): "occupancy_theoretical_pct",
    ("Occupancy", "Achieved Occupancy"): "occupancy_achieved_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Launch Statistics", "Waves Per SM"): "waves",
    ("Compute Workload Analysis", "Issue Slots Busy"): "issue_busy_pct",
    ("Compute Workload Analysis", "Executed Ipc Active"): "ipc_active",
    ("Scheduler Statistics", "No Eligible"): "no_eligible_pct",
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"): "eligible_warps",
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): "cycles_per_issue",
    ("Memory Workload Analysis", "L2 Hit Rate"): "l2_hit_pct",
    ("Memory Workload Analysis", "L1/TEX Hit Rate"): "l1_hit_pct",
    ("Instruction Statistics", "Executed Instructions"): "instructions",
}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
# raw counters (any section) -> short name: shared-memory bank conflicts and wavefronts, to tell an
# issue-bound kernel from one serialized on shared memory
RAW = {
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem_ld_conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "smem_st_conflicts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "smem_wavefronts",
}


def ncu_command(t: Target, kernels: list[str], times: int, stalls: bool = True) -> list[str]:
    """The ncu command line over one target: its kernels only, the checked first round skipped, one round
    profiled, clocks left alone; what it wraps is `kfactory profile run` of the target."""
    n = len(kernels)
    names = "|".join(sorted(set(kernels)))
    cmd = ["ncu", "--clock-control", "none", "--target-processes", "all", "--kernel-name", f"regex:^({names})",
           "--launch-skip", str(n), "--launch-count", str(n), "--csv", "--page", "details"]
    for s in SECTIONS:
        cmd += ["--section", s]
    if stalls:  # the raw counters and stall reasons; without them (the fallback) only the sections
        cmd += ["--metrics", ",".join([*RAW, STALLS])]  # one --metrics: a run with two failed on the H200 (rc 1, its message not kept)
    return cmd + [sys.executable, "-m", "evo.cli.main", "profile", "run", "--op", t.op, "--template", t.template,
                  "--cell", t.cell, "--params", json.dumps(t.params), "--times", str(times)]


def _num(v: str) -> float | str:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return v


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu's `--csv --page details` output as one dict per profiled kernel (in ID order): kernel, grid,
    block, the KEEP metrics by short name ({"value", "unit"}), and `stalls` (reason -> warps a issued
    instruction, largest first) from the stall metrics."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(lines):
        k = kernels.setdefault(row["ID"], {"id": int(row["ID"]), "kernel": row["Kernel Name"], "grid": row.get("Grid Size"),
                                           "block": row.get("Block Size"), "metrics": {}, "stalls": {}})
        name, value = row["Metric Name"], _num(row["Metric Value"])
        short = KEEP.get((row["Section Name"], name)) or RAW.get(name)
        if short:
            k["metrics"][short] = {"value": value, "unit": row["Metric Unit"]}
        elif name.startswith(STALL_PREFIX) and isinstance(value, float):
            k["stalls"][name[len(STALL_PREFIX):].removesuffix("_per_issue_active.ratio")] = value
    out = sorted(kernels.values(), key=lambda k: k["id"])
    for k in out:
        k["stalls"] = dict(sorted(k["stalls"].items(), key=lambda kv: -kv[1]))
    return out


def summarize(out_dir: Path) -> dict:
    """summary.json and summary.md from every NAME.csv in out_dir."""
    summary = {p.stem: parse_ncu_csv(p.read_text()) for p in sorted(out_dir.glob("*.csv"))}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    cols = ["duration", "dram_pct", "sm_pct", "issue_busy_pct", "occupancy_achieved_pct", "registers",
            "no_eligible_pct", "cycles_per_issue", "l2_hit_pct", "instructions", "smem_ld_conflicts",
            "smem_wavefronts"]
    md = ["# Nsight Compute over the factory's kernels", "",
          "Each kernel launched as the gate would (plan, inputs, checks: evo/measure/launches.py); ncu "
          "--clock-control none, one round after the checked one. Stalls: warps stalled per issued "
          "instruction, top three.", "",
          "| target | kernel | " + " | ".join(cols) + " | top stalls |", "|" + "---|" * (len(cols) + 3)]
    for name, ks in summary.items():
        for k in ks:
            vals = []
            for c in cols:
                m = k["metrics"].get(c)
                vals.append("-" if m is None else (f"{m['value']:.3g} {m['unit']}".strip() if isinstance(m["value"], float)
                                                   else str(m["value"])))
            top = ", ".join(f"{r} {v:.2f}" for r, v in list(k["stalls"].items())[:3]) or "-"
            md.append(f"| {name} | {k['kernel']} | " + " | ".join(vals) + f" | {top} |")
    (out_dir / "summary.md").write_text("\n".join(md) + "\n")
    return summary

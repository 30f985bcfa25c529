"""Nsight Compute over the factory's kernels, each launched as the gate would (evo.measure.launches: the
plan of make_job, one input set of the gate's fills, outputs checked against the float64 reference before
and after), so the counters belong to a kernel the gate would pass. For the questions timing cannot
answer: is a launch bound by DRAM, by issue, by latency (warp stall reasons), by occupancy?

    python experiments/scripts/profile_launches.py targets experiments/profile_h200.toml OUT_DIR
        every target under ncu (one process each): OUT_DIR/NAME.csv (ncu --csv --page details),
        OUT_DIR/summary.json and summary.md (the chosen metrics per kernel), OUT_DIR/NAME.log
    python experiments/scripts/profile_launches.py run --op OP --template T --cell LABEL --params JSON
        build (NVRTC), plan, check, then run the launches --times times (what ncu wraps)
    python experiments/scripts/profile_launches.py summarize OUT_DIR   (again from the CSVs)

A target is [[target]] with name, op, and either template + params (over the template's defaults) or
dispatch (a dispatch.json, relative to the targets file) whose entry for the cell gives them; cell is the
cell's label (one of the op's cells). ncu runs with --clock-control none (the clocks are left alone),
skips the checked first round and profiles one round of the plan's kernels.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARCH = "sm_90a"
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


@dataclass(frozen=True)
class Target:
    name: str
    op: str
    template: str
    params: dict
    cell: str


def load_targets(path: Path) -> list[Target]:
    """The targets of a TOML file, each resolved to (op, template, params, cell) and planned; a clear error
    for a target without a cell, an unknown op or template, a dispatch table without the cell, a point
    illegal on its cell, or two targets of one name (before any GPU time is spent)."""
    from evo.core.registry import get_op

    doc = tomllib.loads(path.read_text())
    out: list[Target] = []
    for i, t in enumerate(doc.get("target", [])):
        where = f"{path}: target {i + 1} ({t.get('name', '?')})"
        for key in ("name", "op", "cell"):
            if not isinstance(t.get(key), str):
                raise ValueError(f"{where}: needs a string {key!r}")
        op = get_op(t["op"])
        if t["cell"] not in {c.label() for c in op.all_cells()}:
            raise ValueError(f"{where}: cell {t['cell']!r} is not one of op {op.name}'s cells")
        if "dispatch" in t:
            table = json.loads((path.parent / t["dispatch"]).read_text())["dispatch"]
            if t["cell"] not in table:
                raise ValueError(f"{where}: {t['dispatch']} has no entry for {t['cell']!r}")
            template, params = table[t["cell"]]["template"], dict(table[t["cell"]]["params"])
        elif isinstance(t.get("template"), str):
            template, params = t["template"], dict(t.get("params", {}))
        else:
            raise ValueError(f"{where}: needs template (and params) or dispatch")
        target = Target(t["name"], op.name, template, params, t["cell"])
        try:
            plan(target)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        out.append(target)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: target names repeat: {sorted(n for n in names if names.count(n) > 1)}")
    if not out:
        raise ValueError(f"{path}: no [[target]]")
    return out


def plan(t: Target, build: Any = None):
    """(genome, job, cell) of a target (evo.measure.launches.plan_job)."""
    from evo.loop.pipeline import arch_number
    from evo.measure.launches import plan_job
    from evo.core.registry import get_op

    op = get_op(t.op)
    c = next(c for c in op.all_cells() if c.label() == t.cell)
    g, job = plan_job(op, t.template, c, t.params, arch_number(ARCH), build)
    return g, job, c


def build(t: Target):
    """The NVRTC build of a target at sm_90a; raises RuntimeError with the compiler's error."""
    from evo.build.nvrtc import compile_one, prepare
    from evo.templates.template import load_templates

    g, _, c = plan(t)
    b = compile_one(prepare(load_templates(t.op)[t.template], g, ARCH, c.dtypes_dict(), c.dims_dict()))
    if not b.status.ok:
        raise RuntimeError(f"{t.name}: build failed: {b.error}")
    return b


def ncu_command(t: Target, kernels: list[str], times: int, stalls: bool = True) -> list[str]:
    """The ncu command line over one target: its kernels only, the checked first round skipped, one round
    profiled, clocks left alone."""
    n = len(kernels)
    names = "|".join(sorted(set(kernels)))
    cmd = ["ncu", "--clock-control", "none", "--target-processes", "all", "--kernel-name", f"regex:^({names})",
           "--launch-skip", str(n), "--launch-count", str(n), "--csv", "--page", "details"]
    for s in SECTIONS:
        cmd += ["--section", s]
    if stalls:  # the raw counters and stall reasons; without them (the fallback) only the sections
        cmd += ["--metrics", ",".join([*RAW, STALLS])]  # one --metrics: a run with two failed on the H200 (rc 1, its message not kept)
    return cmd + [sys.executable, str(Path(__file__).resolve()), "run", "--op", t.op, "--template", t.template,
                  "--cell", t.cell, "--params", json.dumps(t.params), "--times", str(times)]


def run(t: Target, times: int) -> dict:
    """Build, plan, check and run the target's launches `times` rounds on this GPU."""
    from cuda.core import ObjectCode

    from evo.measure.launches import run_launches
    from evo.measure.worker import Worker

    b = build(t)
    g, job, _ = plan(t, b)
    w = Worker()
    mod, ref_obj = w._op(t.op)
    obj = ObjectCode.from_cubin(b.cubin)
    geo = run_launches(w, obj, ref_obj, mod, job, times)
    return {"target": t.name, "params": g.params_dict(), "launches": geo, "regs": {k: r.regs for k, r in b.resources},
            "fingerprint": dict(w.fingerprint)}


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


def profile_targets(path: Path, out_dir: Path, times: int = 2, timeout_s: float = 240) -> int:
    """Every target under ncu; a target whose ncu run fails with the stall metrics is run again without
    them; failures are logged, never fatal to the other targets. Returns the number that produced a CSV."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = 0
    for t in load_targets(path):
        _, job, _ = plan(t)
        kernels = [lj.kernel for lj in job.launches]
        log = out_dir / f"{t.name}.log"
        for stalls in (True, False):
            cmd = ncu_command(t, kernels, times, stalls)
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})
                rc, stdout, stderr = p.returncode, p.stdout, p.stderr
            except (subprocess.TimeoutExpired, FileNotFoundError) as e:
                rc, stdout, stderr = -1, "", str(e)
            with log.open("a") as f:
                f.write(f"$ {' '.join(cmd)}\nrc={rc}\n{stderr[-4000:]}\n")
                if rc != 0:  # ncu writes its own errors (==ERROR==) to stdout
                    f.write("".join(ln + "\n" for ln in stdout.splitlines() if ln.startswith("==")))
            if rc == 0 and parse_ncu_csv(stdout):
                (out_dir / f"{t.name}.csv").write_text(stdout)
                done += 1
                break
        print(f"profile {t.name}: {'ok' if (out_dir / f'{t.name}.csv').exists() else 'failed (see log)'}", flush=True)
    summarize(out_dir)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("targets")
    a.add_argument("file", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--times", type=int, default=2)
    r = sub.add_parser("run")
    for k in ("op", "template", "cell", "params"):
        r.add_argument(f"--{k}", required=True)
    r.add_argument("--times", type=int, default=2)
    s = sub.add_parser("summarize")
    s.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "targets":
        n = profile_targets(args.file, args.out, args.times)
        print(f"profiled {n} of {len(load_targets(args.file))} targets into {args.out}")
        return 0 if n else 1
    if args.cmd == "summarize":
        summarize(args.out)
        return 0
    t = Target("run", args.op, args.template, json.loads(args.params), args.cell)
    print(json.dumps(run(t, args.times)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

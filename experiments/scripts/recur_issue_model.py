"""A one-warp issue model of the KDA recurrence's chunk loop, from its SASS and the scheduling bits ptxas wrote
(evo.build.sass.scheduled), with no GPU: one pass over the loop body as one warp would issue it alone on its
scheduler (B = 1, where the recurrence has one or two CTAs an SM and a few warps each), each instruction issued
`stall` cycles after the one before it (at least one) and not before the scoreboards it waits for are released;
a variable-latency instruction releases its write scoreboard LATENCY[opcode] cycles after issue (its read
scoreboard READ_LATENCY after), a barrier costs BARRIER cycles, forward branches fall through (the refill and o's
stores happen; the chunk loop's back edge is its end).

It is an estimate with known gaps, calibrated below against the recurrence launches the H200 timed at B1-T32768-H16
(128 CTAs or fewer: one CTA an SM, its warps alone on their schedulers) and reported as measured cycles a chunk over
model cycles a chunk. It leaves out the shared-memory pipe's queueing (Nsight Compute had the K-split recurrence's
warps waiting on shared-memory results 0.9 cycles an instruction at B1-T8192, profile_h200_2, four times the model's
scoreboard waits), cp.async data that has not landed, and barrier skew between warps. So it ranks variants of one
kernel family (the K-split recurrence, the one-warp-a-column one) by the cycles their instruction order costs; it does
not predict a launch's time.

Run: python experiments/scripts/recur_issue_model.py experiments/results/recur_early_model.json
(KF_NVRTC_ALT=/tmp/nvrtc130 ... experiments/results/recur_early_model_nvrtc13_0.json: built by the H200 image's NVRTC 13.0, as
recur_sass.py)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from evo.build.sass import Control, inner_loops, opcode, scheduled
from evo.templates.template import load_templates
from evo.core.registry import get_op

_spec = importlib.util.spec_from_file_location("recur_sass", Path(__file__).with_name("recur_sass.py"))
recur_sass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recur_sass)

# cycles from issue to the write scoreboard's release (Hopper, unloaded; shared memory ~30 cycles); others: DEFAULT
LATENCY = {"LDS": 30, "LDSM": 32, "SHFL": 28, "LDC": 20, "S2R": 20, "S2UR": 20, "MUFU": 18, "LDG": 450, "LDGSTS": 10,
           "STS": 10, "STG": 10, "I2F": 12, "F2I": 12}
DEFAULT = 20
READ_LATENCY = 8
BARRIER = 24
CALIBRATION = [ROOT / "experiments" / "results" / f"kda_prefill_h200_{n}" / "kda_launch_times.json" for n in (12, 14)]
SEEDS = ROOT / "experiments" / "seeds" / "kda_prefill_carry.json"


def simulate(body: list[tuple[str, Control]]) -> dict:
    """Cycles one warp takes to issue `body` (instructions with their control bits) once, from released scoreboards:
    {"cycles", "stall" (the stall counts' share), "scoreboard" (waits past them), "barrier"}."""
    release = [0] * 6
    nxt = stall = waits = bars = 0
    for text, ctl in body:
        ready = max([nxt] + [release[b] for b in range(6) if ctl.wait >> b & 1])
        waits += ready - nxt
        t = ready
        op = opcode(text)
        if op == "BAR":
            t += BARRIER
            bars += BARRIER
        if ctl.write is not None:
            release[ctl.write] = max(release[ctl.write], t + LATENCY.get(op, DEFAULT))
        if ctl.read is not None:
            release[ctl.read] = max(release[ctl.read], t + READ_LATENCY)
        nxt = t + max(ctl.stall, 1)
        stall += max(ctl.stall, 1)
    return {"cycles": nxt, "stall": stall, "scoreboard": waits, "barrier": bars}


def chunk_loop_body(cubin: bytes) -> list[tuple[str, Control]]:
    """The recurrence's chunk loop (recur_sass.chunk_loop: the innermost loop with the most mma) with its bits."""
    sched = scheduled(cubin, "kda_chunk_recur")
    lp = recur_sass.chunk_loop(inner_loops([t for t, _ in sched]))
    return [(t, c) for t, c in sched[lp.first:lp.last + 1] if c is not None]


def model(tdef, cell, params: dict) -> dict:
    r = recur_sass.build(tdef, cell, params)
    if not r.status.ok:
        raise SystemExit(f"{params}: {r.status.name} {r.error}")
    body = chunk_loop_body(r.cubin)
    res = dict(r.resources)["kda_chunk_recur"]
    return {"instructions": len(body), "regs": res.regs, "spill_stores": res.spill_stores,
            "compiler": r.compiler, **simulate(body)}


def calibration(tdef, cells: dict) -> list[dict]:
    """The recurrences timed at B1-T32768-H16 (kda_prefill_h200_12, _14; rows with a param the template no longer has
    left out), each recurrence once (its first timing), measured against the model: cycles a chunk at the fingerprint's SM clock over model
    cycles a chunk."""
    seen, rows = set(), []
    for path in CALIBRATION:
        doc = json.loads(path.read_text())
        clock_mhz = float(doc["fingerprint"]["sm_clock_mhz"])
        for r in doc["rows"]:
            if r.get("B") != 1 or r.get("T") != 32768:
                continue
            try:
                params = tdef.complete(r["params"])
            except ValueError:
                continue
            (rec,) = [x for x in r["launches"] if x["kernel"] == "kda_chunk_recur"]
            key = json.dumps({k: v for k, v in params.items() if not k.startswith("prep") and k != "stage_in"},
                             sort_keys=True)  # the recurrence's own params: the first timing of each
            if key in seen or rec["ctas"] > recur_sass.SMS:
                continue
            seen.add(key)
            m = model(tdef, cells[r["cell"]], params)
            measured = rec["median_us"] * clock_mhz / -(-r["T"] // params["chunk"])
            rows.append({"cell": r["cell"], "source": str(path.relative_to(ROOT)), "params": params,
                         "median_us": rec["median_us"], "measured_cycles_a_chunk": round(measured, 1), "model": m,
                         "measured_over_model": round(measured / m["cycles"], 3)})
            print(f"calibration kwarps {params['kwarps']} warps {params['warps']} stages {params['stages']} lean "
                  f"{params['recur_lean']} ldsm {params['recur_ldsm']}: measured {measured:.0f} cycles a chunk, model "
                  f"{m['cycles']} ({measured / m['cycles']:.2f}x)")
    return rows


def main(out: str) -> None:
    tdef = load_templates("kda")["chunk"]
    cells = {c.label(): c for c in get_op("kda").all_cells()}
    rows = []
    for label, e in sorted(json.loads(SEEDS.read_text())["dispatch"].items()):
        p = tdef.complete(e["params"])
        if p["kwarps"] == 1:
            continue
        for name, over in [("recur_addr swz", {"recur_addr": "swz"}), ("recur_addr hoist", {"recur_addr": "hoist"}),
                           ("carry", {}), ("carry, recur_early mid", {"recur_early": "mid"}),
                           ("carry, recur_early late", {"recur_early": "late"})]:
            m = model(tdef, cells[label], p | over)
            rows.append({"cell": label, "variant": name, "params": p | over, "model": m})
            print(f"{label[17:60]} kwarps {p['kwarps']} {name}: {m['instructions']} instructions, {m['cycles']} "
                  f"cycles (stall {m['stall']}, scoreboard {m['scoreboard']}, barrier {m['barrier']}), "
                  f"{m['regs']} registers")
    doc = {"what": __doc__.split("\n\n")[0], "limits": __doc__.split("\n\n")[1],
           "latency": LATENCY, "default_latency": DEFAULT, "read_latency": READ_LATENCY, "barrier": BARRIER,
           "seeds": str(SEEDS.relative_to(ROOT)), "entries": rows, "calibration": calibration(tdef, cells)}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: recur_issue_model.py OUT_JSON")
    main(sys.argv[1])

"""What recur_addr = carry might do to kda_prefill_h200_15's dispatch, estimated (no GPU ran it): per prefill cell, the
recurrence launch's measured median (experiments/results/kda_prep_ex2_h200/kda_launch_times.json, the ex2-rowcol row,
whose params are the dispatch entry's) scaled by the chunk loop's instructions a warp with carry over those as dispatched
(experiments/results/recur_sass_nvrtc13_0.json, the H200 image's NVRTC 13.0), put back into the dispatch's measured
total beside fla's chunk_kda in the same process (kda_prefill_h200_15/bench_repeat). Two models: "proportional" (the
step as long as its instruction count, as Nsight had the B = 1 recurrence) and "half" (half that gain, for kernels with
more warps a scheduler, where fewer instructions hide less). Estimates, not measurements.

Run: python experiments/scripts/carry_estimate.py experiments/results/carry_estimate.json
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

RES = Path(__file__).resolve().parents[1] / "results"


def main(out: str) -> None:
    dispatch = json.loads((RES / "kda_prefill_h200_15/dispatch.json").read_text())["dispatch"]
    launches = {r["cell"]: r for r in json.loads((RES / "kda_prep_ex2_h200/kda_launch_times.json").read_text())["rows"]
                if r["test"] == "prep_ex2" and r["variant"] == "ex2-rowcol"}
    sass = json.loads((RES / "recur_sass_nvrtc13_0.json").read_text())["entries"]
    counts = {(e["cell"], e["variant"]): e["chunk_loop"]["instructions"] for e in sass}
    bench = {r["cell"]: r for r in csv.DictReader(open(RES / "kda_prefill_h200_15/bench_repeat/kda_bench.csv"))}
    rows = []
    for cell, entry in sorted(dispatch.items()):
        lt = launches[cell]
        if lt["params"] != entry["params"]:
            raise SystemExit(f"{cell}: the timed recurrence is not the dispatch's ({lt['params']} vs {entry['params']})")
        recur = next(x["median_us"] for x in lt["launches"] if x["kernel"] == "kda_chunk_recur")
        total, fla = float(bench[cell]["median_us"]), json.loads(bench[cell]["peers"])["fla.chunk_kda"]
        before, carry = counts[(cell, "as dispatched")], counts[(cell, "recur_addr carry")]
        row = {"cell": cell, "total_us": total, "fla_us": fla, "ratio": fla / total, "recur_us": recur,
               "chunk_loop": before, "chunk_loop_carry": carry}
        for model, share in (("proportional", 1.0), ("half", 0.5)):
            est = total - share * recur * (1 - carry / before)
            row[model] = {"total_us": est, "ratio": fla / est}
        rows.append(row)
        print(f"{cell[40:80]}: {total:.0f} us ({fla / total:.2f}x fla) -> {row['proportional']['total_us']:.0f} us "
              f"({row['proportional']['ratio']:.2f}x) proportional, {row['half']['total_us']:.0f} us "
              f"({row['half']['ratio']:.2f}x) half")
    Path(out).write_text(json.dumps({"what": __doc__.split("\n\n")[0], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: carry_estimate.py OUT_JSON")
    main(sys.argv[1])

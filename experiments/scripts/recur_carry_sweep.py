"""recur_addr = carry on every lean, ldmatrix-fed one-warp-a-column recurrence of the chunk template (NVRTC builds, no
GPU): for each legal (chunk, warps, stages, state_split, u_prefetch, recur_fuse) on a prefill cell, the recurrence as it
is (recur_addr swz) and with carry where carry is legal (carry_on_the_lean_ldsm_recurrence refuses it with
recur_fuse, for which it is not written): registers, spill stores, loads and stack, and the chunk loop's instructions a
warp (evo/build/sass.py, the innermost loop with the most mma).

Run: python experiments/scripts/recur_carry_sweep.py OUT_JSON
With the H200 image's NVRTC 13.0 (pip install --no-deps --target /tmp/nvrtc130 "nvidia-cuda-nvrtc==13.0.*"):
KF_NVRTC_ALT=/tmp/nvrtc130 python experiments/scripts/recur_carry_sweep.py OUT_JSON
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

from evo.build.sass import disassemble, inner_loops
from evo.templates.template import load_templates
from ops.kda.spec import prefill_matrix
from recur_sass import build, chunk_loop  # this folder's: a point built by this NVRTC or $KF_NVRTC_ALT's

CARRY_RULE = "carry_on_the_lean_ldsm_recurrence"


def measure(tdef, cell, params: dict) -> dict:
    r = build(tdef, cell, params)
    if not r.status.ok:
        raise SystemExit(f"{params}: {r.status.name} {r.error}")
    res = dict(r.resources)["kda_chunk_recur"]
    loop = chunk_loop(inner_loops(disassemble(r.cubin, "kda_chunk_recur")))
    return {"compiler": r.compiler, "regs": res.regs, "spill_stores": res.spill_stores, "spill_loads": res.spill_loads,
            "stack_bytes": res.stack_bytes, "chunk_loop": loop.size}


def main(out: str) -> None:
    tdef = load_templates("kda")["chunk"]
    cell = prefill_matrix()[2]
    dt, dims = cell.dtypes_dict(), cell.dims_dict()
    base = tdef.default_params() | {"stage_in": True, "recur_lean": True, "recur_ldsm": True}
    rows = []
    for chunk, w, ns, split, upf, fuse in itertools.product(tdef.values("chunk"), tdef.values("warps"),
                                                             tdef.values("stages"), (False, True), (False, True),
                                                             (False, True)):
        p = base | {"chunk": chunk, "warps": w, "stages": ns, "state_split": split, "u_prefetch": upf,
                    "recur_fuse": fuse}
        if tdef.violations(p, 90, dt, dims):
            continue
        refused = tdef.violations(p | {"recur_addr": "carry"}, 90, dt, dims)
        assert refused in ([], [CARRY_RULE]), refused
        row = {"chunk": chunk, "warps": w, "stages": ns, "state_split": split, "u_prefetch": upf, "recur_fuse": fuse,
               "carry_legal": not refused, "swz": measure(tdef, cell, p),
               "carry": None if refused else measure(tdef, cell, p | {"recur_addr": "carry"})}
        rows.append(row)
        carry = row["carry"]
        print(f"chunk {chunk} warps {w} stages {ns} split {split:d} u_prefetch {upf:d} fuse {fuse:d}: "
              f"swz {row['swz']['chunk_loop']} ({row['swz']['regs']} regs, {row['swz']['spill_stores']} B spilled), "
              + (f"carry {carry['chunk_loop']} ({carry['regs']} regs, {carry['spill_stores']} B)" if carry
                 else "carry refused"), flush=True)
    legal = [r for r in rows if r["carry_legal"]]
    summary = {"recurrences": len(rows), "carry_legal": len(legal),
               "carry_legal_spilling": sum(r["carry"]["spill_stores"] > 0 for r in legal),
               "carry_legal_shorter": sum(r["carry"]["chunk_loop"] < r["swz"]["chunk_loop"] for r in legal),
               "swz_spilling": sum(r["swz"]["spill_stores"] > 0 for r in rows)}
    doc = {"what": __doc__.split("\n\n")[0], "cell": cell.label(), "arch": "sm_90a",
           "compiler": rows[0]["swz"]["compiler"] if rows else "", "summary": summary, "rows": rows}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: recur_carry_sweep.py OUT_JSON")
    main(sys.argv[1])

"""Every entry of a dispatch table rebuilt with NVRTC (no GPU), each kernel's registers, spill stores and loads and
stack as ptxas reports them: what a run recorded as "regs 0" where the H200 image's compiler handed back no report.

Run: python experiments/scripts/dispatch_spills.py OP DISPATCH_JSON OUT_JSON
(the files in experiments/results/dispatch_spills/, e.g. OP rmsnorm_bwd, DISPATCH_JSON
experiments/results/rmsnorm_peers_h200/chain6_bwd_dispatch.json, OUT_JSON
experiments/results/dispatch_spills/rmsnorm_bwd_chain6.json)
(KF_NVRTC_ALT=DIR builds with the NVRTC in DIR, e.g. the H200 image's 13.0: docs/nvrtc_13_0.md.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from evo.build.nvrtc import Builder, prepare
from evo.core.genome import Genome
from evo.templates.template import load_templates
from evo.core.registry import get_op


def main(op_name: str, table: str, out: str) -> None:
    op = get_op(op_name)
    tdefs = load_templates(op.name)
    cells = {c.label(): c for c in op.all_cells()}
    entries = json.loads(Path(table).read_text())["dispatch"]
    inputs = []
    for label, e in entries.items():
        t, c = tdefs[e["template"]], cells[label]
        g = Genome.make(op.name, t.name, t.source_hash, t.default_params() | e["params"])
        inputs.append(prepare(t, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
    with Builder(2, nvrtc=os.environ.get("KF_NVRTC_ALT") or None) as builder:  # another NVRTC where that names one
        built = builder.build(inputs)
    rows = []
    for (label, e), r in zip(entries.items(), built):
        kernels = {k: {"regs": x.regs, "spill_stores": x.spill_stores, "spill_loads": x.spill_loads,
                       "stack_bytes": x.stack_bytes} for k, x in r.resources}
        rows.append({"cell": label, "template": e["template"], "params": e["params"], "median_us": e.get("median_us"),
                     "status": r.status.name, "kernels": kernels})
        spill = {k: v for k, v in kernels.items() if v["spill_stores"] or v["stack_bytes"]}
        print(f"{label:<34} {e['template']:<14} {r.status.name:<6} " + (f"SPILLS {spill}" if spill else "clean"))
    doc = {"what": __doc__.split("\n\n")[0], "op": op.name, "table": table,
           "compiler": built[0].compiler if built else "", "entries": rows}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:4])

"""Every entry of a dispatch table rebuilt with NVRTC (no GPU): each kernel's registers, spill stores and loads
and stack as ptxas reports them (a run's record may lack them where its compiler handed back no report)."""

from __future__ import annotations

from pathlib import Path

from evo.build.nvrtc import Builder, prepare
from evo.core.genome import Genome
from evo.templates.template import load_templates
from evo.tools.errors import ToolInputError, read_json
from evo.core.registry import get_op

ARCH = "sm_90a"
WHAT = "registers, spills and stack of every dispatch entry, rebuilt with NVRTC"


def spills(op_name: str, table: Path, nvrtc: str | None = None) -> dict:
    """The table's entries rebuilt for `op_name` at sm_90a (with the NVRTC in folder `nvrtc` where given), each
    with its build status and per-kernel regs, spill_stores, spill_loads and stack_bytes."""
    op = get_op(op_name)
    tdefs = load_templates(op.name)
    cells = {c.label(): c for c in op.all_cells()}
    entries = read_json(table).get("dispatch")
    if not isinstance(entries, dict):
        raise ToolInputError(f"{table} has no 'dispatch' object")
    inputs = []
    for label, e in entries.items():
        if e.get("template") not in tdefs or label not in cells:
            raise ToolInputError(f"{table}: entry {label!r} names no {op.name} cell and template")
        t, c = tdefs[e["template"]], cells[label]
        g = Genome.make(op.name, t.name, t.source_hash, t.default_params() | e["params"])
        inputs.append(prepare(t, g, ARCH, c.dtypes_dict(), c.dims_dict()))
    with Builder(2, nvrtc=nvrtc) as builder:
        built = builder.build(inputs)
    rows = []
    for (label, e), r in zip(entries.items(), built):
        kernels = {k: {"regs": x.regs, "spill_stores": x.spill_stores, "spill_loads": x.spill_loads,
                       "stack_bytes": x.stack_bytes} for k, x in r.resources}
        rows.append({"cell": label, "template": e["template"], "params": e["params"], "median_us": e.get("median_us"),
                     "status": r.status.name, "kernels": kernels})
    return {"what": WHAT, "op": op.name, "table": str(table), "compiler": built[0].compiler if built else "",
            "entries": rows}


def spill_line(row: dict) -> str:
    """One entry as a line: cell, template, status, and its spilling kernels or 'clean'."""
    spill = {k: v for k, v in row["kernels"].items() if v["spill_stores"] or v["stack_bytes"]}
    return f"{row['cell']:<34} {row['template']:<14} {row['status']:<6} " + (f"SPILLS {spill}" if spill else "clean")

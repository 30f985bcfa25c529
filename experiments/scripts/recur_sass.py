"""The KDA recurrence's chunk loop in SASS (NVRTC builds, no GPU), for each entry of a prefill dispatch table: the
launch's shape on its cell (CTAs, threads, dynamic shared memory, and the CTAs an SM can hold by shared memory and by
registers, so the waves the grid takes on the H200's 132 SMs), the kernel's registers, and its chunk loop (the
innermost loop with the most mma) counted by opcode: the instructions each warp issues, in order, once a chunk.

What the counts tell apart at B = 1, where the recurrence is a chain of NT chunk steps with a few warps an SM: the mma
work (HMMA) and its shared-memory operands (LDSM, LDS), the ring's refill (LDGSTS: 16-byte cp.async, each with its
64-bit source address), integer instructions (address and index arithmetic), and the barriers. A K-split entry
(kwarps > 1) is analysed again with recur_addr = hoist (its shared addresses as bases plus immediates) and carry (hoist with
the refill's sources, u's words and o's address carried from chunk to chunk); a lean, ldmatrix-fed one-warp-a-column
entry with carry (its items' slots carried a chunk at a time, each kind's source a call at a time).

Run: python experiments/scripts/recur_sass.py tests/fixtures/results/kda_prefill_h200_15/dispatch.json \
         OUT_JSON
With the H200 image's NVRTC 13.0 (pip install --no-deps --target /tmp/nvrtc130 "nvidia-cuda-nvrtc==13.0.*"):
KF_NVRTC_ALT=/tmp/nvrtc130 python experiments/scripts/recur_sass.py ... OUT_JSON
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from evo.build.nvrtc import Builder, build_point, prepare
from evo.core.genome import Genome
from evo.build.sass import Loop, disassemble, inner_loops
from evo.templates.template import load_templates
from evo.core.registry import get_op

SMS = 132  # the H200's SMs
SMEM_PER_SM = 228 * 1024  # bytes an SM shares among its CTAs (each CTA also reserves 1 KB)
REGS_PER_SM = 65536
INTEGER = frozenset({"IMAD", "IADD3", "VIADD", "LEA", "SHF", "LOP3", "ISETP", "UIADD3", "ULEA", "USHF", "MOV", "UMOV",
                     "SEL"})  # opcodes without their modifiers (evo.build.sass.opcode)


def chunk_loop(loops: list[Loop]) -> Loop:
    """The recurrence's chunk loop: the innermost loop with the most mma (the tail loops that store o have fewer)."""
    return max(loops, key=lambda lp: (lp.count("HMMA"), lp.size))


def ctas_an_sm(threads: int, smem: int, regs: int) -> dict:
    by_smem = SMEM_PER_SM // (smem + 1024) if smem else 32
    by_regs = REGS_PER_SM // (math.ceil(regs * 32 / 256) * 256 * math.ceil(threads / 32))
    return {"by_smem": by_smem, "by_regs": by_regs, "ctas_an_sm": min(by_smem, by_regs, 32, 2048 // threads)}


def build(tdef, cell, params: dict):
    """The point built by this process's NVRTC, or by $KF_NVRTC_ALT's in a compile process that loads it."""
    alt = os.environ.get("KF_NVRTC_ALT")
    if not alt:
        return build_point(tdef, params, cell.dtypes_dict(), cell.dims_dict())  # (refuses an illegal point)
    full = tdef.complete(params)
    bad = tdef.violations(full, 90, cell.dtypes_dict(), cell.dims_dict())
    if bad:
        raise SystemExit(f"{params} breaks {bad} on {cell.label()}")
    g = Genome.make("kda", tdef.name, tdef.source_hash, full)
    with Builder(1, nvrtc=alt) as b:
        (r,) = b.build([prepare(tdef, g, "sm_90a", cell.dtypes_dict(), cell.dims_dict())])
    return r


def analyse(tdef, cell, params: dict) -> dict:
    r = build(tdef, cell, params)
    if not r.status.ok:
        raise SystemExit(f"{params}: {r.status.name} {r.error}")
    res = dict(r.resources)["kda_chunk_recur"]
    launches, _ = tdef.plan(tdef.complete(params), 90, cell.dtypes_dict(), cell.dims_dict())
    (recur,) = [x for x in launches if x.kernel == "kda_chunk_recur"]
    ctas = recur.grid[0] * recur.grid[1] * recur.grid[2]
    threads = recur.block[0] * recur.block[1] * recur.block[2]
    fit = ctas_an_sm(threads, recur.smem, res.regs)
    lp = chunk_loop(inner_loops(disassemble(r.cubin, "kda_chunk_recur")))
    ops = dict(lp.ops)
    return {"params": tdef.complete(params), "compiler": r.compiler, "regs": res.regs, "spill_stores": res.spill_stores,
            "ctas": ctas, "threads": threads, "smem": recur.smem, **fit,
            "waves": math.ceil(ctas / (fit["ctas_an_sm"] * SMS)),
            "warps_an_sm": min(ctas, fit["ctas_an_sm"] * SMS) * threads // 32 / SMS,
            "chunk_loop": {"instructions": lp.size, "HMMA": ops.get("HMMA", 0),
                           "shared_loads": ops.get("LDSM", 0) + ops.get("LDS", 0), "STS": ops.get("STS", 0),
                           "LDGSTS": ops.get("LDGSTS", 0), "LDG": ops.get("LDG", 0), "STG": ops.get("STG", 0),
                           "integer": sum(n for op, n in ops.items() if op in INTEGER),
                           "float": sum(n for op, n in ops.items() if op[0] == "F"),
                           "BAR": ops.get("BAR", 0), "opcodes": ops}}


def main(table_path: str, out: str) -> None:
    op = get_op("kda")
    tdef = load_templates("kda")["chunk"]
    cells = {c.label(): c for c in op.all_cells()}
    table = json.loads(Path(table_path).read_text())["dispatch"]
    rows = []
    for label, e in sorted(table.items()):
        variants = [("as dispatched", e["params"])]
        full = tdef.complete(e["params"])
        if full["kwarps"] > 1:  # the K-split recurrence: also with recur_addr = hoist, carry
            variants += [(f"recur_addr {a}", e["params"] | {"recur_addr": a}) for a in ("hoist", "carry")]
        elif full["recur_lean"] and full["recur_ldsm"] and not full["recur_fuse"]:  # the lean one-warp one: carry
            variants.append(("recur_addr carry", e["params"] | {"recur_addr": "carry"}))
        for name, params in variants:
            a = analyse(tdef, cells[label], params)
            rows.append({"cell": label, "variant": name, "median_us": e.get("median_us") if name == "as dispatched"
                         else None, **a})
            report(label, name, a)
    doc = {"what": __doc__.split("\n\n")[0], "table": table_path, "arch": "sm_90a",
           "compiler": rows[0]["compiler"] if rows else "", "entries": rows}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


def report(label: str, name: str, a: dict) -> None:
    lp = a["chunk_loop"]
    print(f"{label[17:60]} ({name}): {a['ctas']} CTAs of {a['threads']} threads, {a['ctas_an_sm']} an SM "
          f"({a['waves']} wave(s), {a['warps_an_sm']:.1f} warps an SM), {a['regs']} registers; chunk loop "
          f"{lp['instructions']} instructions: {lp['HMMA']} HMMA, {lp['shared_loads']} shared loads, "
          f"{lp['LDGSTS']} LDGSTS, {lp['integer']} integer, {lp['BAR']} BAR")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: recur_sass.py DISPATCH_JSON OUT_JSON")
    main(sys.argv[1], sys.argv[2])

"""NVRTC builds (no GPU) of the KDA chunk template at the points whose spills an earlier ptxas parser hid,
each kernel's registers, spill stores and loads and stack as ptxas reports them now: the numbers behind
tests/unit/test_kda_chunk.py::pinned_spill, the README and docs/kda_prep_analysis.md. The split-K recurrence that
B1-T8192 dispatches (kda_prefill_h200_13) is built twice: today's text, and the text with its own partials of o
read from registers at a run-time index (tests/gpu/test_kda_launch_times.py LOCAL_PO) as before the fix.

Run: python experiments/scripts/chunk_spills.py OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evo.build.nvrtc import build_point, compiler_version
from evo.templates.template import load_templates, parse_template
from ops.kda.reference import Variant
from ops.kda.spec import DType, cell, prefill_matrix, varlen_matrix

from tests.gpu.test_kda_launch_times import LOCAL_PO, SHARED_PO  # the GPU A/B's two texts of that line

ROOT = Path(__file__).resolve().parents[2]
SPLIT = {"chunk": 32, "prep_threads": 256, "prep_diag": "split", "stage_in": True, "warps": 2, "stages": 6}


def points() -> list[tuple[str, object, dict]]:
    cells = prefill_matrix()
    b1, b8 = cells[0], cells[2]
    table = json.loads((ROOT / "tests/fixtures/results/kda_prefill_h200_13/dispatch.json").read_text())["dispatch"]
    return [
        ("prep at chunk 64, 256 threads (the default point)", b1, {"chunk": 64}),
        ("prep_blocks 4 (split prep, 256 threads)", b1, SPLIT | {"prep_blocks": 4}),
        ("prep_blocks 3 (its twin)", b1, SPLIT | {"prep_blocks": 3}),
        ("split prep, 256 threads, expf, on the varlen model call (gate, beta logits, qk norm)", varlen_matrix()[0],
         SPLIT | {"prep_exp": "expf", "warps": 4, "stages": 3}),
        ("prep at chunk 64, 256 threads, q and k normalized in the kernel",
         cell(DType.BF16, 1, 8192, 32, variant=Variant(qk_l2norm=True)),
         {"chunk": 64, "prep_threads": 256, "warps": 2, "stages": 3}),
        ("split-K recurrence, warps 8, kwarps 2 (512 threads)", b8, {"chunk": 32, "prep_threads": 128, "warps": 8,
                                                                      "kwarps": 2, "stages": 3}),
        ("split-K recurrence at chunk 64, warps 2, kwarps 2", b8, {"chunk": 64, "prep_threads": 128, "warps": 2,
                                                                    "kwarps": 2, "stages": 3}),
        ("B1-T8192's dispatch (kwarps 2)", b1, table[b1.label()]["params"]),
        ("B1-T32768's dispatch (kwarps 4)", cells[3], table[cells[3].label()]["params"]),
    ]


def build(tdef, c, params: dict) -> dict:
    try:
        r = build_point(tdef, params, c.dtypes_dict(), c.dims_dict())
    except ValueError as e:
        raise SystemExit(f"{e} on {c.label()}") from e
    if not r.status.ok:
        raise SystemExit(f"{params} on {c.label()}: {r.status.name} {r.error}")
    return {k: {"regs": x.regs, "spill_stores": x.spill_stores, "spill_loads": x.spill_loads,
                "stack_bytes": x.stack_bytes} for k, x in r.resources}


def main(argv: list[str]) -> int:
    today = load_templates("kda")["chunk"]
    assert today.text.count(SHARED_PO) == 1, "the own-partials line changed: see tests/gpu/test_kda_launch_times.py"
    before = parse_template(today.text.replace(SHARED_PO, LOCAL_PO), "chunk, own partials at a run-time index",
                            trusted=True)
    rows = []
    for what, c, params in points():
        rows.append({"point": what, "cell": c.label(), "params": params, "kernels": build(today, c, params)})
        if params.get("kwarps", 1) > 1 and "dispatch" in what:
            rows.append({"point": what + ", own partials at a run-time index (before the fix)", "cell": c.label(),
                         "params": params, "kernels": build(before, c, params)})
        print(rows[-1]["point"], rows[-1]["kernels"])
    doc = {"compiler": compiler_version(), "arch": "sm_90a", "template_source_hash": today.source_hash, "rows": rows}
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

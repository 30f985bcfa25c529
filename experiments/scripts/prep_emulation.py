"""The KDA chunk prep's numerics by emulation (numpy, no GPU): the share of each output's tolerance (RMS-relative
error against the float64 reference over the bound) that the emulated kernel uses, the worst over every fill kind,
both input sources and both directions of the exponential's error, on the plain emulation cells and on the variant
cells; and the share of chunks each of prep_diag = mma's wide flags marks on each fill kind (prep_aref = block: some
diagonal block's channel moves by more than DIAG_RANGE from the block's first token; chunk: from token 16); and, as a
what-if, the shares with the workspace's u stored as bf16 (u_stored_as_bf16: not a template option).

The emulation is ops/kda/emulate_chunk.py's (emulate, emulate_cell), at the points and on the cells the unit tests
check (tests/unit/test_kda_chunk.py: EMU_POINTS' ex2 + rowcol + mma diagonal points: tf32 w, u; bf16 w, u; bf16 w, u
with the chunk reference; EMU_CELLS, VARIANT_CELLS).

Run from the project root: PYTHONPATH=. python experiments/scripts/prep_emulation.py experiments/results/prep_emulation.json
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ops.kda import SPEC
from ops.kda.spec import FILLS
from ops.kda import emulate_chunk
from ops.kda.emulate_chunk import DIAG_RANGE, LOG2E, base2_cumsum, chunk_is_wide, diag_is_wide, emulate, emulate_cell
from tests.unit.test_kda_chunk import EMU_CELLS, EMU_POINTS, TDEF, VARIANT_CELLS, emu_id, emulation_inputs, variant_inputs
from tests.unit.test_kda_recurrent import passes

POINTS = [p for p in EMU_POINTS if p.get("prep_exp") == "ex2" and p.get("prep_addr") == "rowcol"]


def worst_shares(cells, inputs_of, emulate_one, p: dict) -> dict[str, float]:
    """The largest share of the tolerance used, per output, over the cells, their inputs and both error signs."""
    worst: dict[str, float] = {}
    for c in cells:
        scal = SPEC.scalar_values(c)
        for _, _, inputs in inputs_of(c):
            for sign in (1, -1):
                ins, got = emulate_one(inputs, scal, c, p, sign)
                want = SPEC.reference(ins, scal)
                for name in want:
                    ok, share = passes(got[name], want[name], SPEC.tolerance(c, name))
                    if not ok:
                        raise SystemExit(f"{emu_id(p)} fails on {c.label()} {name}: {share:.3f} of the tolerance")
                    worst[name] = max(worst.get(name, 0.0), round(share, 4))
    return worst


def wide_shares(chunk: int = 32) -> dict[str, dict[str, float]]:
    """Per fill kind, the share of the plain cells' full chunks each wide flag marks (prep_exp = ex2's base-2 G)."""
    out = {}
    bound = np.float32(DIAG_RANGE) * LOG2E
    for kind in FILLS:
        block = ref = n = 0
        for c in EMU_CELLS:
            T = c.dim("T")
            if T < chunk:
                continue
            g = np.asarray(SPEC.make_inputs(c, kind, np.random.default_rng(1))["g"], np.float32)  # [B, T, HV, K]
            nt = T // chunk
            G = base2_cumsum(g[:, :nt * chunk].reshape(g.shape[0], nt, chunk, *g.shape[2:]), 2)  # [B, NT, C, HV, K]
            G = np.moveaxis(G, 3, 2)  # [B, NT, HV, C, K]
            block += int(diag_is_wide(G, bound).sum())
            ref += int(chunk_is_wide(G, bound).sum())
            n += G[..., 0, 0].size
        out[kind] = {"chunks": n, "block_wide": round(block / n, 4), "chunk_wide": round(ref / n, 4)}
    return out


@contextmanager
def u_stored_as_bf16():
    """A what-if, not an option of the template: the workspace's u rounded to bf16 after launch 1 (as if the prep stored
    it as bf16 and the recurrence widened it back), the rest unchanged. emulate and emulate_cell reach launch 1 through
    the module's emulate_prep, which this wraps for the block's duration."""
    plain = emulate_chunk.emulate_prep
    emulate_chunk.emulate_prep = lambda *a, **k: (lambda ws: ws | {"u": emulate_chunk.bf(ws["u"])})(plain(*a, **k))
    try:
        yield
    finally:
        emulate_chunk.emulate_prep = plain


def point_row(fit: dict, label: str = "") -> dict:
    """The worst shares at one point on the plain cells and on the variant cells, printed and as a JSON row."""
    p = TDEF.default_params() | fit
    plain = worst_shares(EMU_CELLS, emulation_inputs, lambda i, s, c, q, e: (i, emulate(i, s, c, q, e)), p)
    variants = worst_shares(VARIANT_CELLS, variant_inputs, emulate_cell, p)
    print(f"{emu_id(p)}{label}: plain {plain}, variants {variants}")
    return {"point": emu_id(p), "params": fit, "plain_cells": plain, "variant_cells": variants}


def main(out: str) -> None:
    rows = [point_row(fit) for fit in POINTS]
    with u_stored_as_bf16():
        what_if = [point_row(fit, " with u stored as bf16") for fit in POINTS
                   if fit.get("prep_wu") == "bf16" and fit.get("prep_aref") != "chunk"]
    doc = {"what": __doc__.split("\n\n")[0], "plain_cells": [c.label() for c in EMU_CELLS],
           "variant_cells": [c.label() for c in VARIANT_CELLS], "points": rows, "wide_flags": wide_shares(),
           "what_if_u_bf16": {"what": u_stored_as_bf16.__doc__.split(". ")[0], "points": what_if}}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prep_emulation.json")

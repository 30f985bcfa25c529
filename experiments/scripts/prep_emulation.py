"""The KDA chunk prep's numerics by emulation (numpy, no GPU): the share of each output's tolerance (RMS-relative
error against the float64 reference over the bound) that the emulated kernel uses, the worst over every fill kind,
both input sources and both directions of the exponential's error, on the plain emulation cells and on the variant
cells; and the share of chunks each of prep_diag = mma's wide flags marks on each fill kind (prep_aref = block: some
diagonal block's channel moves by more than DIAG_RANGE from the block's first token; chunk: from token 16). The points
include prep_u = bf16 (the workspace's u written as bf16; an emulated what-if before it became a template option).

The emulation is ops/kda/emulate_chunk.py's (emulate, emulate_cell), at the points and on the cells the unit tests
check (tests/unit/test_kda_chunk.py: EMU_POINTS' ex2 + rowcol + mma diagonal points: tf32 w, u; bf16 w, u; bf16 w, u
with the chunk reference; bf16 w, u with u stored as bf16; EMU_CELLS, VARIANT_CELLS). At prep_u = bf16 the variant cells
are only those where the template offers it (not beta = 2 sigmoid: bf16_u_on_the_carry_split_k_recurrence); the refused
cells' worst shares are reported apart.

Run from the project root: PYTHONPATH=. python experiments/scripts/prep_emulation.py OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ops.kda import SPEC
from ops.kda.spec import FILLS
from ops.kda.emulate_chunk import DIAG_RANGE, LOG2E, base2_cumsum, chunk_is_wide, diag_is_wide, emulate_cell
from tests.unit.test_kda_chunk import (ARCH, EMU_CELLS, EMU_POINTS, TDEF, VARIANT_CELLS, emu_id, emulate_plain, emulated_shares,
                                      emulation_inputs, variant_inputs)

POINTS = [p for p in EMU_POINTS if p.get("prep_exp") == "ex2" and p.get("prep_addr") == "rowcol"]


def worst_shares(cells, inputs_of, emulate_one, p: dict, strict: bool = True) -> dict[str, float]:
    """The largest share of the tolerance used, per output, over the cells, their inputs and both error signs (every
    point here is ex2, which has two; strict: a failing case stops the run)."""
    worst: dict[str, float] = {}
    for c in cells:
        for _, _, name, _, ok, share in emulated_shares(c, p, inputs_of(c), emulate_one):
            if not ok and strict:
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


def point_row(fit: dict) -> dict:
    """The worst shares at one point on the plain cells and on the variant cells where the point is legal (and, apart,
    on those where it is refused), printed and as a JSON row."""
    p = TDEF.default_params() | fit
    served = [c for c in VARIANT_CELLS if TDEF.is_valid(p, ARCH, c.dtypes_dict(), c.dims_dict())]
    plain = worst_shares(EMU_CELLS, emulation_inputs, emulate_plain, p)
    variants = worst_shares(served, variant_inputs, emulate_cell, p)
    row = {"point": emu_id(p), "params": fit, "plain_cells": plain, "variant_cells": variants}
    refused = [c for c in VARIANT_CELLS if c not in served]
    if refused:
        row["refused_cells"] = [c.label() for c in refused]
        row["refused_cells_shares"] = worst_shares(refused, variant_inputs, emulate_cell, p, strict=False)
    print(f"{emu_id(p)}: plain {plain}, variants {variants}" + (f", refused {row['refused_cells_shares']}" if refused else ""))
    return row


def main(out: str) -> None:
    rows = [point_row(fit) for fit in POINTS]
    doc = {"what": __doc__.split("\n\n")[0], "plain_cells": [c.label() for c in EMU_CELLS],
           "variant_cells": [c.label() for c in VARIANT_CELLS], "points": rows, "wide_flags": wide_shares()}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prep_emulation.json")

"""experiments/scripts/copy_sizes.py: its sizes are the KDA decode cells' state traffic (the spec's bytes moved, less
the few per-token vectors), so its shares are comparable with the decode bench's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ops.kda import SPEC

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("copy_sizes", ROOT / "experiments" / "scripts" / "copy_sizes.py")
copy_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(copy_sizes)


@pytest.mark.parametrize("b", copy_sizes.DECODE_B)
def test_sizes_are_the_decode_cells_state_traffic(b):
    cell = next(c for c in SPEC.matrix() if c.dim("T") == 1 and c.dim("B") == b)
    state = copy_sizes.state_bytes(b, cell.dim("HV"), cell.dim("K"), cell.dim("V"))
    assert state == copy_sizes.state_bytes(b)  # the script's defaults are the matrix's head and tile sizes
    moved = SPEC.bytes_moved(cell)
    assert 2 * state <= moved <= 2 * state * 1.02, (b, state, moved)  # + q, k, v, g, beta, o: 1.2%

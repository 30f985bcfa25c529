"""evo/tools/hand_gate.py on the CPU: a real NVRTC build of a genome and the gate job the search's evaluator would
make of it (`kfactory regate` and the scripts that run the gate by hand build it here, so a wrong job would mislead
every one of them)."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import Builder
from evo.cli.bench import default_for_cell
from evo.templates.template import load_templates
from evo.tools import hand_gate
from evo.core.registry import get_op

PREFIX = "w=bf16,x=bf16 M4096-N1024"


def test_cell_by_prefix_finds_the_first_matching_cell_and_names_a_missing_one():
    op = get_op("rmsnorm")
    assert hand_gate.cell_by_prefix(op, PREFIX).label().startswith(PREFIX)
    with pytest.raises(ValueError, match="no rmsnorm matrix cell starts with 'w=bf17'"):
        hand_gate.cell_by_prefix(op, "w=bf17")


def test_a_hand_job_is_the_evaluators_job_of_a_real_build_with_or_without_gate_cells():
    op, tdef = get_op("rmsnorm"), load_templates("rmsnorm")["cta_row"]
    cell = hand_gate.cell_by_prefix(op, PREFIX)
    params = default_for_cell(tdef, 90, cell)
    with Builder(workers=1) as builder:
        gated = hand_gate.hand_job(builder, op, tdef, params, cell, seed=7)
        bare = hand_gate.hand_job(builder, op, tdef, params, cell, seed=7, baseline=True, gate_cells=False)
        with pytest.raises(RuntimeError, match="did not build"):
            hand_gate.hand_job(builder, op, tdef, {**params, "threads": 7}, cell, seed=7)
    assert gated.build.status.ok and gated.job.cubin[:4] == b"\x7fELF"
    assert gated.genome.params_dict() == params and gated.cell is cell
    assert gated.gate_cells and all(g.dtypes_dict() == cell.dtypes_dict() for g in gated.gate_cells)
    assert bare.gate_cells == () and bare.job.cubin == gated.job.cubin
    assert {k for k, _ in gated.job.tolerances}  # the judge reads one tolerance per output

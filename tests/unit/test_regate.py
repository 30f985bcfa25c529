"""`kfactory regate`'s case file (evo/tools/regate.py): what it needs, and the clear errors it gives without it (the GPU part needs a device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.tools import regate as R

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_case_file_loads_and_names_legal_points():
    from evo.search.space import legal_cells
    from evo.templates.template import load_templates
    from evo.core.registry import get_op

    cases = R.load_cases(ROOT / "experiments" / "regate" / "bwd_fp32_h100.json")
    assert len(cases) == 4
    for c in cases:
        op = get_op(c["op"])
        cells = [x for x in op.matrix() if x.label().startswith(c["cell"])]
        assert len(cells) == 1, c["cell"]
        assert legal_cells(load_templates(op.name)[c["template"]], c["params"], 90, cells) == cells


@pytest.mark.parametrize("doc, why", [
    ([], "non-empty list"),
    ({"op": "rmsnorm"}, "non-empty list"),
    ([{"op": "rmsnorm_bwd", "template": "rows_smem", "params": {}}], "lacks ['cell']"),
    ([{"op": "rmsnorm_bwd", "template": "rows_smem", "params": {}, "cell": "x", "reps": 0}], "0 repetitions"),
])
def test_a_bad_case_file_is_refused_naming_the_problem(tmp_path, capsys, doc, why):
    p = tmp_path / "cases.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
        R.load_cases(p)
    assert main(["regate", str(p), "--out", str(tmp_path / "out.json")]) == 2
    assert why in capsys.readouterr().err and not (tmp_path / "out.json").exists()

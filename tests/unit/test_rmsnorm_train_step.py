"""experiments/scripts/rmsnorm_train_step.py without a GPU: the markdown table of its JSON (the GPU part needs an
exported package and torch)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments/scripts/rmsnorm_train_step.py"
_spec = importlib.util.spec_from_file_location("rmsnorm_train_step", SCRIPT)
rts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rts)


def _cell(n: int, ours: float, eager: float, liger: float | None, split: bool) -> dict:
    med = {"ours": ours, "torch.eager": eager, **({"liger": liger} if liger else {})}
    c = {"cell": f"w=bfloat16,x=bfloat16 M32768-N{n}", "M": 32768, "N": n,
         "dtypes": {"w": "bfloat16", "x": "bfloat16"}, "paths": {"rmsnorm": "table", "rmsnorm_bwd": "table-build"},
         "median_us": med, "ours_speedup": {k: v / ours for k, v in med.items() if k != "ours"},
         "rstd_us": {"one_reduction": 170.0, "rstd_3pass": 1500.0},
         "wrong": {} if liger else {"liger": "dx: 3 of 9 checked elements off"}, "absent": {}}
    if split:
        c["host_us"] = {"ours": 60.0, "torch.eager": 40.0}
    return c


def test_the_table_gives_each_sides_time_and_the_packages_speedup_over_it():
    doc = {"cells": [_cell(4096, 500.0, 1000.0, 450.0, True), _cell(8192, 1000.0, 1500.0, None, False)]}
    lines = rts.markdown(doc).splitlines()
    assert lines[0].startswith("| cell | paths | ours µs | liger µs (x) | torch.eager µs (x) |")
    assert lines[2] == ("| M32768-N4096 bfloat16/bfloat16 | table+table-build | 500.0 | 450.0 (0.900x) | "
                        "1000.0 (2.000x) | 170.0 / 1500.0 | 60.0 / 40.0 |")
    assert lines[3].split(" | ")[3] == "wrong" and lines[3].split(" | ")[4] == "1500.0 (1.500x)"
    assert len(lines) == 4


def test_the_table_from_the_command_line(tmp_path):
    f = tmp_path / "train.json"
    f.write_text(json.dumps({"cells": [_cell(4096, 500.0, 1000.0, 450.0, True)]}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--table", str(f)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0 and "2.000x" in r.stdout, r.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "--table"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_host_parts_table_follows_where_host_parts_ran():
    with_parts = _cell(4096, 500.0, 1000.0, 450.0, True)
    with_parts["host_parts_us"] = {"step": 900.0, "forward": 300.0, "launch": 12.5}
    doc = {"cells": [with_parts, _cell(8192, 1000.0, 1500.0, None, False)]}
    text = rts.markdown(doc)
    tail = text.split("Host µs a call, per part (median):")[1].strip().splitlines()
    assert tail[0] == "| cell | step | forward | launch |" and tail[1] == "|---|---:|---:|---:|"
    assert tail[2] == "| M32768-N4096 bfloat16 | 900.0 | 300.0 | 12.5 |" and len(tail) == 3
    assert "per part" not in rts.markdown({"cells": [_cell(8192, 1000.0, 1500.0, None, False)]})

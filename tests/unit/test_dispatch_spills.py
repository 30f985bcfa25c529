"""`kfactory dispatch spills` (evo/tools/dispatch_spills.py) on a real dispatch table's entries (NVRTC builds, no GPU): the backward's
fp32 M32768-N16384 winner is reported spilling, a clean entry clean, every kernel of the plan listed."""

from __future__ import annotations

import json
from pathlib import Path

from evo.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

TABLE = ROOT / "tests/fixtures/results/rmsnorm_peers_h200/chain6_bwd_dispatch.json"


def test_spilling_and_clean_entries_are_told_apart(tmp_path: Path) -> None:
    entries = json.loads(TABLE.read_text())["dispatch"]
    keep = ("w=fp32,x=fp32 M32768-N16384", "w=fp32,x=fp32 M32768-N4096")
    table = tmp_path / "dispatch.json"
    table.write_text(json.dumps({"dispatch": {k: entries[k] for k in keep}}))
    out = tmp_path / "spills.json"
    assert main(["dispatch", "spills", "rmsnorm_bwd", str(table), str(out)]) == 0
    doc = json.loads(out.read_text())
    got = {e["cell"]: e for e in doc["entries"]}
    assert set(got) == set(keep) and doc["compiler"].startswith("nvrtc-")
    for e in got.values():
        assert e["status"] == "OK" and set(e["kernels"]) == {"rmsnorm_bwd_rows", "rmsnorm_bwd_dw_reduce"}
    rows = got[keep[0]]["kernels"]["rmsnorm_bwd_rows"]
    assert rows["spill_stores"] > 0 and rows["stack_bytes"] > 0 and rows["regs"] == 255
    assert all(v["spill_stores"] == 0 and v["stack_bytes"] == 0 for v in got[keep[1]]["kernels"].values())

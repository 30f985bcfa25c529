"""`kfactory dispatch translate` (evo/tools/translate_dispatch.py): a table's winners carried to the other dtypes by bytes per row
(the vector width in elements scaled to keep the bytes a load), as a table of predictions that seeds a run."""

from __future__ import annotations

import json
from pathlib import Path

from evo.cli.main import main
from evo.loop.seed_tables import table_seeds
from evo.templates.template import load_templates
from evo.tools.translate_dispatch import translate
from ops.rmsnorm import SPEC

ROOT = Path(__file__).resolve().parents[2]

B8K = "w=bf16,x=bf16 M4096-N8192"
F4K = "w=fp32,x=fp32 M4096-N4096"


def _e(template, vec, us, threads=256):
    return {"template": template, "params": {"threads": threads, "vec": vec}, "median_us": us}


def test_a_16bit_winner_becomes_the_fp32_prediction_of_the_same_bytes_and_back():
    doc = translate([{"run_id": "r", "dispatch": {
        B8K: _e("cta_row_l2", 8, 36.0), F4K: _e("cta_row", 4, 37.0),
        "w=bf16,x=bf16 M4096-N1024": _e("cta_row", 1, 6.0),  # vec 1 on bf16 has no fp32 equivalent
        "w=bf16,x=fp32 M4096-N1024": _e("cta_row", 8, 6.0)}}])  # mixed dtypes: not translated
    d = doc["dispatch"]
    assert doc["kind"] == "predictions" and all("median_us" not in e for e in d.values())
    assert d[F4K] == {"template": "cta_row_l2", "params": {"threads": 256, "vec": 4}, "translated_from": B8K,
                      "source_median_us": 36.0}
    assert d[B8K]["params"]["vec"] == 8 and d[B8K]["translated_from"] == F4K  # fp32 vec 4 -> 16-bit vec 8
    assert d["w=fp16,x=fp16 M4096-N8192"]["translated_from"] == F4K
    assert "w=fp32,x=fp32 M4096-N512" not in d and not any(k.startswith("w=bf16,x=fp32") for k in d)


def test_of_two_sources_for_one_cell_the_faster_is_kept():
    doc = translate([
        {"dispatch": {B8K: _e("cta_row", 8, 40.0), "w=fp16,x=fp16 M4096-N8192": _e("cta_row_l2", 8, 35.0)}},
        {"dispatch": {B8K: _e("cta_row_async", 8, 38.0)}}])
    assert doc["dispatch"][F4K]["template"] == "cta_row_l2" and doc["dispatch"][F4K]["source_median_us"] == 35.0


def test_a_predictions_table_seeds_beside_the_measured_best(tmp_path):
    t = load_templates("rmsnorm")
    run = {k: t[k] for k in ("cta_row", "cta_row_l2")}
    cells = {F4K: next(c for c in SPEC.all_cells() if c.label() == F4K)}
    measured = tmp_path / "m.json"
    measured.write_text(json.dumps({"dispatch": {F4K: _e("cta_row", 4, 37.0, 512)}}))
    slower = tmp_path / "s.json"
    slower.write_text(json.dumps({"dispatch": {F4K: _e("cta_row", 4, 39.0, 1024)}}))
    pred = tmp_path / "p.json"
    pred.write_text(json.dumps(translate([{"dispatch": {B8K: _e("cta_row_l2", 8, 36.0)}}])))
    got = table_seeds([str(measured), str(slower), str(pred)], "rmsnorm", run, cells)
    seeded = [(s.genome.template, s.genome.params_dict()["threads"], s.genome.params_dict()["vec"]) for s in got.seeds]
    assert seeded == [("cta_row", 512, 4), ("cta_row_l2", 256, 4)]  # the slower measured entry is not seeded
    assert not got.skipped  # bf16 goes to fp32 only (fp16 has its size)
    without = table_seeds([str(measured), str(slower)], "rmsnorm", run, cells)
    assert [s.genome.template for s in without.seeds] == ["cta_row"]


def test_a_table_of_an_unknown_kind_is_a_config_error(tmp_path):
    import pytest

    from evo.core.config import ConfigError
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "guesses", "dispatch": {}}))
    with pytest.raises(ConfigError, match="kind 'guesses' is neither"):
        table_seeds([str(bad)], "rmsnorm", {}, {})


def test_the_committed_seed_table_is_what_the_command_writes_from_its_sources(tmp_path, capsys):
    seeds = json.loads((ROOT / "experiments/seeds/rmsnorm_bytes_per_row.json").read_text())
    R = ROOT / "tests/fixtures/results"
    srcs = [R / "rmsnorm_peers_h200/fwd_hold_fp16_fp32_dispatch.json", R / "rmsnorm_h200_long2/dispatch.json",
            R / "rmsnorm_h200_long/dispatch.json", R / "rmsnorm_h200_regimes/dispatch.json"]
    assert seeds["dispatch"] == translate([json.loads(p.read_text()) for p in srcs])["dispatch"]
    out = tmp_path / "seeds.json"
    assert main(["dispatch", "translate", str(out), *map(str, srcs)]) == 0
    assert json.loads(out.read_text()) == seeds
    assert main(["dispatch", "translate", str(out), str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err

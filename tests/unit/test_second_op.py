"""The second op (row-wise softmax) runs through `kfactory run` with no engine change: real NVRTC
builds of its template for sm_90a, recorded in a real DuckDB store, on a CPU-only machine."""

from __future__ import annotations

from pathlib import Path

from evo.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_softmax_run_builds_and_records(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("evo.measure.run.gpu_available", lambda: False)
    store = tmp_path / "s.duckdb"
    rc = main(["run", str(ROOT / "experiments" / "softmax_h200.toml"), "--store", str(store)])
    assert rc == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err
    rc = main(["sql", "SELECT count(DISTINCT b.build_key) AS n FROM builds b JOIN candidates c USING (genome_key) "
               "WHERE b.status = 'OK' AND b.regs > 0 AND c.op = 'softmax' AND c.template = 'cta_row'",
               "--store", str(store)])
    assert rc == 0 and int(capsys.readouterr().out.split()[-1]) >= 9

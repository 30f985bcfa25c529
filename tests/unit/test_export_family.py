"""The export's op-family plug-ins: the engine finds the one that lists a run's op (rmsnorm_bwd is served
by ops/rmsnorm/export), refuses an op no plug-in lists in one line, and keeps family files apart from
the generic runtime's."""

from __future__ import annotations

import duckdb
import pytest

from evo.cli.main import main
from evo.export import family as fam
from evo.export.errors import ExportError
from evo.export.make import export
from evo.export.write import RUNTIME, runtime_files
from memory.store import Store
from tests.unit import export_fixtures as fx


@pytest.mark.parametrize("op,role", [("rmsnorm", "forward"), ("rmsnorm_bwd", "backward")])
def test_the_rmsnorm_family_serves_forward_and_backward(op, role):
    f = fam.find_family(op)
    assert f.module == "ops.rmsnorm.export" and dict(f.ops)[op] == role
    assert f.name == "kf_rmsnorm" and "{runs}" in f.description
    assert (f.runtime / "package" / "api.py").is_file() and not (RUNTIME / "package" / "api.py").exists()


def test_an_op_without_an_exporter_is_one_line_naming_it():
    with pytest.raises(ExportError) as e:
        fam.find_family("softmax")
    assert "op softmax has no exporter" in str(e.value) and "\n" not in str(e.value)


def test_runs_of_two_families_are_refused(monkeypatch):
    other = fam.Family("ops.other.export", (("other", "forward"),), "kf_other", "d {runs}",
                       fam.find_family("rmsnorm").runtime, lambda *a: "")
    real = fam.find_family
    monkeypatch.setattr(fam, "find_family", lambda op: other if op == "other" else real(op))
    with pytest.raises(ExportError, match="different exporters: rmsnorm .ops.rmsnorm.export., other"):
        fam.family_of(["rmsnorm", "other"])


def test_a_family_file_named_as_a_generic_one_is_refused(tmp_path):
    for sub in ("package", "tests"):
        (tmp_path / sub).mkdir()
    (tmp_path / "package" / "loader.py").write_text("# mine\n")
    f = fam.Family("ops.x.export", (("x", "forward"),), "kf_x", "{runs}", tmp_path, lambda *a: "")
    with pytest.raises(ExportError, match="package/loader.py is also a file of the generic runtime"):
        runtime_files("package", f)


def test_a_bad_role_is_refused(tmp_path):
    with pytest.raises(ExportError, match="role 'sideways'"):
        fam.Family("ops.x.export", (("x", "sideways"),), "kf_x", "{runs}", tmp_path, lambda *a: "")


def test_export_of_a_run_whose_op_has_no_exporter_writes_nothing(tmp_path, capsys):
    plan = {("bf16", 4096, 1024): [(fx.WIN_1K, 4.0)]}
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        fx.write_run(s, fx.build_all(plan), plan=plan)
    with duckdb.connect(str(path)) as con:  # as if the run had searched an op no plug-in exports
        con.execute("UPDATE runs SET op = 'softmax' WHERE run_id = ?", [fx.RUN])
    out = tmp_path / "pkg"
    assert main(["export", fx.RUN, "--store", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kfactory export: error: ") and "op softmax has no exporter" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".pkg")]


def test_the_package_name_defaults_to_the_family_name(tmp_path):
    plan = {("bf16", 4096, 1024): [(fx.WIN_1K, 4.0)]}
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        fx.write_run(s, fx.build_all(plan), plan=plan)
    done = export(path, [fx.RUN], tmp_path / "o")
    assert done.name == "kf_rmsnorm" and (tmp_path / "o" / "kf_rmsnorm" / "api.py").is_file()
    assert (tmp_path / "o" / "kf_rmsnorm" / "loader.py").read_bytes() == (RUNTIME / "package" / "loader.py").read_bytes()

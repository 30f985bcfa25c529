"""`kfactory export` on the CPU: a store with finished runs (real templates, real sm_90a builds) becomes a
package whose files agree with the store, whose sources compile with NVRTC to the measured cubins, which
pip installs and imports without a GPU (or torch), and whose own CPU tests pass; mistakes are one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evo.build.nvrtc import NVRTC_STD, compile_one, include_dir, prepare
from evo.cli.main import main
from tests.unit.export_fixtures import pip_install
from evo.templates.render import render
from memory.store import Store
from evo.core.registry import get_op
from tests.unit import export_fixtures as fx

NAME = "kf_test"
CHILD_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def built():
    return fx.build_all()


@pytest.fixture(scope="module")
def store(tmp_path_factory, built):
    return fx.make_store(tmp_path_factory.mktemp("store") / "s.duckdb", built)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, store):
    out = tmp_path_factory.mktemp("pkg") / NAME
    assert main(["export", fx.RUN, "--store", str(store), "--out", str(out), "--name", NAME]) == 0
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory, exported):
    return pip_install(exported, tmp_path_factory.mktemp("pip"))


def _doc(exported: Path) -> dict:
    return json.loads((exported / NAME / "data" / "dispatch.json").read_text())["ops"]["rmsnorm"]


def test_files_agree_with_the_store(exported, store):
    doc, data = _doc(exported), exported / NAME / "data"
    winners = {fx.cell(dt, m, n).label(): fx.genome(*rows[0][0]).key() for (dt, m, n), rows in fx.PLAN.items()}
    assert {e["cell"]: e["genome_key"] for e in doc["entries"]} == winners
    assert len(doc["builds"]) == 3  # the two bf16 N=8192 cells share a build, and so do the fp32 cells
    # the op's published cells, searched or not, for the package's benchmark: the matrix and its named matrices,
    # each cell naming the matrix it belongs to ("" the op's own)
    spec = get_op("rmsnorm")
    published: dict = {}  # a cell in two matrices (bias_rstd's store_rstd cells are train's too) names the first
    for n, c in [*(("", c) for c in spec.matrix()), *((n, c) for n, f in spec.matrices.items() for c in f())]:
        published.setdefault(c, n)
    assert [(c["matrix"], c["cell"]) for c in doc["matrix"]] == [(n, c.label()) for c, n in published.items()]
    assert {c["matrix"] for c in doc["matrix"]} == {"", "residual", "bias_rstd", "serving", "serving_residual",
                                                    "train"}
    with Store.open(store, read_only=True) as s:
        measured = s.sql("SELECT e.cell, b.cubin FROM evaluations e JOIN builds b USING (build_key) "
                         "WHERE e.run_id = ? AND e.status = 'OK'", [fx.RUN])
        n_evals = int(s.sql("SELECT count(*) AS n FROM evaluations WHERE run_id = ?", [fx.RUN]).n[0])
    cubin_of = {(r.cell, bytes(r.cubin)) for r in measured.itertuples(index=False)}
    for e in doc["entries"]:
        b = doc["builds"][e["build"]]
        cu, cubin = (data / b["cu"]).read_text(), (data / b["cubin"]).read_bytes()
        assert (e["cell"], cubin) in cubin_of  # the very binary the run measured
        assert hashlib.sha256(cu.encode()).hexdigest() == b["cu_sha256"] and b["cubin_from"] == "store"
        assert e["template"] == b["template"] and e["params"] == b["params"] and e["median_us"] > 0
        assert (data / doc["templates"][b["template"]]["file"]).exists()
    assert (data / "templates" / "_macros" / "memory.cuh.j2").exists()
    prov = json.loads((data / "provenance.json").read_text())["ops"]["rmsnorm"]
    assert prov["run"]["run_id"] == fx.RUN and prov["run"]["status"] == "done" and prov["table_from"] == "store"
    assert prov["fingerprints"] == [fx.FP]
    assert len((data / "results" / "rmsnorm_evaluations.csv").read_text().strip().splitlines()) == n_evals + 1
    readme = (exported / "README.md").read_text()
    assert fx.RUN in readme and "No backward run was exported" in readme
    assert {p.name for p in (exported / "tests").iterdir()} == {"conftest.py", "test_launch.py", "test_cpu.py", "test_gpu.py"}
    assert f'name = "{NAME.replace("_", "-")}"' in (exported / "pyproject.toml").read_text()


def test_every_exported_source_compiles_for_sm_90a_to_the_shipped_cubin(exported):
    from cuda.core import Program, ProgramOptions

    doc, data = _doc(exported), exported / NAME / "data"
    opts = ProgramOptions(arch="sm_90a", std=NVRTC_STD, include_path=[include_dir()], ptxas_options=["-v"])
    for b in doc["builds"].values():
        cubin = Program((data / b["cu"]).read_text(), code_type="c++", options=opts).compile("cubin").code
        assert bytes(cubin) == (data / b["cubin"]).read_bytes(), b["cu"]


_CHILD = """
import hashlib, json, sys
import kf_test as kf
from kf_test import loader
from kf_test.table import tables
shapes = {"table": ((4096, 1024), "bf16"), "table-build": ((77, 1024), "bf16"), "rerender": ((77, 2048), "bf16"),
          "table-build-fp32": ((5, 3000), "fp32"), "repaired": ((3, 33), "bf16"), "3d": ((2, 3, 8192), "bf16")}
out = {"torch_imported": "torch" in sys.modules, "cuda_core_imported": "cuda.core" in sys.modules}
for k, (shape, dt) in shapes.items():
    c = kf.explain(shape, dt, arch=90)
    out[k] = {"path": c.path, "params": dict(c.params), "consts": dict(c.consts), "line": str(c)}
out["bias"] = kf.explain((4096, 1024), "bf16", bias=True, arch=90).path
c = kf.explain((77, 2048), "bf16", arch=90)
src = loader.source_for(tables()["rmsnorm"], c)
out["rerender_source"] = src
out["rerender_cubin_sha"] = hashlib.sha256(loader.compile_cubin(src, loader.arch_flag(90, "sm_90a"))).hexdigest()
print(json.dumps(out))
"""


def test_installed_package_imports_without_a_gpu_and_explains_its_paths(installed):
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, cwd=installed, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": str(installed)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert not out["torch_imported"] and not out["cuda_core_imported"]  # import and explain need neither
    assert out["table"]["path"] == "table"
    assert out["table-build"]["path"] == "table-build"  # same cubin, another M
    assert out["table-build-fp32"]["path"] == "table-build"  # warp_row compiles no dim in: any N % vec == 0
    assert out["3d"]["path"] == "table-build" and "M=6 N=8192" in out["3d"]["line"]
    assert out["rerender"]["path"] == "rerender" and out["rerender"]["consts"] == {"N": 2048}
    assert out["repaired"]["path"] == "repaired" and out["repaired"]["params"]["vec"] == 1
    assert "with" in out["repaired"]["line"] and "vec 8->1" in out["repaired"]["line"]
    assert out["bias"] == "torch"
    # the package's renderer gives the factory's source for an off-table shape, and NVRTC builds it
    ref = render(fx.TEMPLATES["cta_row"], out["rerender"]["params"], 90, fx.cell("bf16", 77, 2048).dtypes_dict(),
                 {"N": 2048})
    assert ref.status.ok and out["rerender_source"] == ref.source
    assert out["rerender_cubin_sha"] == hashlib.sha256(compile_one(prepare(
        fx.TEMPLATES["cta_row"], fx.genome("cta_row", out["rerender"]["params"]), "sm_90a",
        fx.cell("bf16", 77, 2048).dtypes_dict(), {"M": 77, "N": 2048})).cubin).hexdigest()


def test_the_package_own_cpu_tests_pass_where_it_is_installed(installed, exported, tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(exported / "tests")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": str(installed)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.parametrize("args,words", [
    (["nope"], "no run 'nope'"),
    (["exp-running"], "is not finished (status 'running'"),
    (["exp-empty"], "empty dispatch table"),
    ([fx.RUN, "exp-r2"], "2 runs of op rmsnorm"),
    ([fx.RUN, "--name", "Bad-Name"], "is not a package name"),
], ids=["unknown-run", "unfinished", "empty-dispatch", "two-forward-runs", "bad-name"])
def test_mistakes_are_one_line_and_write_nothing(store, tmp_path, capsys, args, words):
    out = tmp_path / "pkg"
    rc = main(["export", *args, "--store", str(store), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("kfactory export: error: ") and words in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".pkg")]


def test_an_out_folder_that_is_not_empty_is_refused(store, tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "keep.txt").write_text("mine")
    assert main(["export", fx.RUN, "--store", str(store), "--out", str(tmp_path / "pkg")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "pkg").iterdir()] == ["keep.txt"]
    assert main(["export", fx.RUN, "--store", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "o")]) == 2
    assert "no store at" in capsys.readouterr().err


def test_the_table_the_run_published_is_followed_and_checked(built, tmp_path, capsys):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        fx.write_run(s, built)
    label = fx.cell("bf16", 4096, 1024).label()
    slower = fx.genome(*fx.LOSE_1K).key()
    published = tmp_path / "runs" / fx.RUN / "dispatch.json"
    published.parent.mkdir(parents=True)
    published.write_text(json.dumps({"run_id": fx.RUN, "dispatch": {
        label: {"genome_key": slower, "measured_in": fx.RUN}}}))
    assert main(["export", fx.RUN, "--store", str(path), "--out", str(tmp_path / "a"), "--name", NAME]) == 0
    doc = _doc(tmp_path / "a")
    assert [(e["cell"], e["genome_key"]) for e in doc["entries"]] == [(label, slower)]
    prov = json.loads((tmp_path / "a" / NAME / "data" / "provenance.json").read_text())
    assert prov["ops"]["rmsnorm"]["table_from"] == "dispatch.json"
    published.write_text(json.dumps({"run_id": fx.RUN, "dispatch": {label: {"genome_key": "f" * 64}}}))
    assert main(["export", fx.RUN, "--store", str(path), "--out", str(tmp_path / "b")]) == 2
    assert "holds no OK evaluation of it there" in capsys.readouterr().err


def test_a_source_that_no_longer_builds_the_measured_cubin_is_refused(built, tmp_path, capsys):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        fx.write_run(s, built, corrupt_cubin=True)  # as if a template include had changed since the run
    assert main(["export", fx.RUN, "--store", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "compiles to another cubin than the one the run measured" in err and not (tmp_path / "o").exists()

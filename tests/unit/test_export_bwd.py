"""`kfactory export` of the committed backward run (H200, op rmsnorm_bwd, template cluster_rows: a rows
kernel with compile-time clusters + a dw column-sum kernel over an fp32 workspace), from a tmp copy of
its store: alone, and with a forward run beside it. The package agrees with the store, its sources
rebuild the measured cubins with the run's NVRTC, it installs and imports without a GPU (or torch),
explain() names the path of table and off-table shapes, and its own CPU tests pass."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from evo.build.nvrtc import compile_one, compiler_version, prepare
from evo.cli.main import main
from tests.unit.export_fixtures import pip_install
from evo.core.genome import Genome
from evo.templates.render import render
from evo.templates.sandbox import TEMPLATES_ROOT
from evo.templates.template import parse_template
from memory.store import Store
from tests.unit import bwd_export_fixtures as bx
from tests.unit import export_fixtures as fx

NAME = "kf_bwd"
COMMITTED = bx.committed_sha256()  # at collection, before any test ran
CHILD_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
WORKSPACE = "4 * min(M, groups) * N"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return bx.copy_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def nvrtc(tmp_path_factory):
    return bx.nvrtc_args(tmp_path_factory.mktemp("nvrtc"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, store, nvrtc):
    out = tmp_path_factory.mktemp("pkg") / NAME
    assert main(["export", bx.RUN, "--store", str(store), "--out", str(out), "--name", NAME, *nvrtc]) == 0
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory, exported):
    return pip_install(exported, tmp_path_factory.mktemp("pip"))


def _dispatch(out: Path, name: str = NAME) -> dict:
    return json.loads((out / name / "data" / "dispatch.json").read_text())


def _child(code: str, path: list[Path], timeout: int = 300) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": os.pathsep.join(map(str, path))}, cwd=path[0])
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_backward_only_export_is_the_run_table_with_the_measured_cubins(exported, store):
    doc = _dispatch(exported)
    assert set(doc["ops"]) == {"rmsnorm_bwd"}
    op, data = doc["ops"]["rmsnorm_bwd"], exported / NAME / "data"
    published = json.loads((bx.RESULTS / "dispatch.json").read_text())["dispatch"]
    assert {e["cell"]: e["genome_key"] for e in op["entries"]} == {c: d["genome_key"] for c, d in published.items()}
    assert len(op["entries"]) == 7 and {e["dtypes"]["x"] for e in op["entries"]} == {"bfloat16"}
    with Store.open(store, read_only=True) as s:
        text = s.sql("SELECT text FROM sources WHERE template = 'cluster_rows'").text[0]
        builds = s.sql("SELECT e.eval_id, b.build_key, b.cubin, b.compiler FROM evaluations e "
                       "JOIN builds b USING (build_key) WHERE e.run_id = ?", [bx.RUN])
    measured = {r.eval_id: (r.build_key, bytes(r.cubin), r.compiler) for r in builds.itertuples(index=False)}
    clusters = set()
    for e in op["entries"]:
        b = op["builds"][e["build"]]
        key, cubin, compiler = measured[e["eval_id"]]
        assert (b["build_key"], (data / b["cubin"]).read_bytes(), b["compiler"]) == (key, cubin, bx.NVRTC), e["cell"]
        assert b["cubin_from"] == "store" and b["consts"] == {"N": e["dims"]["N"]}
        cu = (data / b["cu"]).read_text()
        c = e["params"]["cluster"]
        clusters.add(c)
        # the cluster is compiled in: an ordinary launch, grid.x = cluster (the template's plan)
        assert (f"__cluster_dims__({c}, 1, 1)" in cu, "__cluster_dims__" in cu) == (c > 1, c > 1), e["cell"]
    assert clusters >= {1, 2, 8}
    (tid, t), = op["templates"].items()
    assert (data / t["file"]).read_text() == text and t["source_hash"] == hashlib.sha256(text.encode()).hexdigest()
    assert t["workspaces"] == {"dw_partial": WORKSPACE} and t["specialize"] == ["N"]
    assert [(ln["kernel"], ln["grid"]) for ln in t["launches"]] == [
        ("rmsnorm_bwd_rows", ["cluster", "min(M, groups)"]), ("rmsnorm_bwd_dw_reduce", ["ceil_div(N, 32)"])]
    assert all("dw_partial" in ln["args"] for ln in t["launches"])  # written by the first, read by the second
    for inc in ("_macros/memory.cuh.j2", "_macros/cluster.cuh.j2"):  # the ones the rebuild used
        assert (data / "templates" / inc).read_bytes() == (TEMPLATES_ROOT / inc).read_bytes()
    prov = json.loads((data / "provenance.json").read_text())["ops"]["rmsnorm_bwd"]
    assert prov["table_from"] == "dispatch.json" and prov["run"]["run_id"] == bx.RUN
    assert {(k["cubin_from"], k["compiler"], k["rebuilt_with"]) for k in prov["kernels"].values()} == {
        ("store", bx.NVRTC, bx.NVRTC)}
    assert len((data / "results" / "rmsnorm_bwd_evaluations.csv").read_text().strip().splitlines()) == 165 + 1
    readme = (exported / "README.md").read_text()
    assert bx.RUN in readme and "No forward run was exported" in readme and "column-sum kernel writes dw" in readme


_COMPILE = """
import hashlib, json, pathlib, sys
nvrtc = sys.argv[1] if len(sys.argv) > 1 else None
if nvrtc:  # the run's NVRTC, loaded before cuda.bindings looks for one
    from evo.build.nvrtc_lib import find_nvrtc, load_nvrtc
    load_nvrtc(find_nvrtc(pathlib.Path(nvrtc)))
from kf_bwd import loader
from kf_bwd.expr import DATA
doc = json.loads((DATA / "dispatch.json").read_text())
out = {"nvrtc": loader.nvrtc_version(), "cubins": {}}
for bid, b in doc["ops"]["rmsnorm_bwd"]["builds"].items():
    cubin = loader.compile_cubin((DATA / b["cu"]).read_text(), loader.arch_flag(90, "sm_90a"))
    out["cubins"][bid] = hashlib.sha256(cubin).hexdigest()
print(json.dumps(out))
"""


def test_every_shipped_source_compiles_with_the_run_nvrtc_to_the_shipped_cubin(installed, exported, nvrtc):
    # the package's own NVRTC path (its options, headers found by cuda.pathfinder), run's NVRTC version
    r = subprocess.run([sys.executable, "-c", _COMPILE, *nvrtc[1:]], capture_output=True, text=True, timeout=600,
                       check=False, cwd=installed,
                       env={**CHILD_ENV, "PYTHONPATH": os.pathsep.join([str(installed), str(bx.ROOT)])})
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["nvrtc"] == bx.NVRTC
    builds = _dispatch(exported)["ops"]["rmsnorm_bwd"]["builds"]
    want = {bid: hashlib.sha256((exported / NAME / "data" / b["cubin"]).read_bytes()).hexdigest()
            for bid, b in builds.items()}
    assert len(want) == 7 and out["cubins"] == want


_EXPLAIN = """
import hashlib, json, sys
import kf_bwd as kf
from kf_bwd import loader
from kf_bwd.table import tables
out = {"torch_imported": "torch" in sys.modules, "cuda_core_imported": "cuda.core" in sys.modules, "cells": {}}
t = tables()["rmsnorm_bwd"]
def info(c):
    d = {"path": c.path, "params": dict(c.params), "consts": dict(c.consts), "build": c.build, "line": str(c)}
    if c.kernel:
        tm = t.templates[c.template]
        launches, ws = tm.plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))
        src = loader.source_for(t, c)
        d.update(grids=[list(ln.grid) for ln in launches], ws=ws, clusters=loader.cluster_dims(src))
        for ln in launches:
            loader.check_grid(ln, loader.cluster_dims(src))
    return d
for e in t.entries:
    m, n = dict(e.dims)["M"], dict(e.dims)["N"]
    out["cells"][e.cell] = {"build": e.build, "table": info(kf.explain((m, n), "bf16", op="rmsnorm_bwd")),
                           "m37": info(kf.explain((37, n), "bf16", op="rmsnorm_bwd"))}
for k, shape in {"new_n": (77, 12288), "odd_n": (37, 1001), "3d": (2, 3, 5, 8192)}.items():
    out[k] = info(kf.explain(shape, "bf16", op="rmsnorm_bwd"))
out["fwd"] = str(kf.explain((64, 4096), "bf16"))
out["dout32"] = str(kf.explain((64, 4096), "bf16", op="rmsnorm_bwd", dout_dtype="float32"))
c = kf.explain((77, 12288), "bf16", op="rmsnorm_bwd", arch=90)
out["new_n_source"] = loader.source_for(t, c)
out["new_n_cubin"] = hashlib.sha256(loader.compile_cubin(out["new_n_source"], "sm_90a")).hexdigest()
print(json.dumps(out))
"""


def test_installed_package_explains_backward_shapes_without_a_gpu(installed, store):
    out = _child(_EXPLAIN, [installed])
    assert not out["torch_imported"] and not out["cuda_core_imported"]  # import and explain need neither
    assert len(out["cells"]) == 7
    for cell, d in out["cells"].items():
        assert (d["table"]["path"], d["table"]["build"]) == ("table", d["build"]), d["table"]["line"]
        # another M of a searched N: the same measured cubin, only the launch plan changes
        assert (d["m37"]["path"], d["m37"]["build"]) == ("table-build", d["build"]), d["m37"]["line"]
        p, m37 = d["m37"]["params"], d["m37"]
        assert m37["grids"][0] == [p["cluster"], min(37, p["groups"]), 1] and m37["ws"] == {
            "dw_partial": 4 * min(37, p["groups"]) * m37["consts"]["N"]}
        assert m37["clusters"] == ({"rmsnorm_bwd_rows": [p["cluster"], 1, 1]} if p["cluster"] > 1 else {})
    assert out["3d"]["path"] == "table-build" and "M=30 N=8192" in out["3d"]["line"]
    new = out["new_n"]  # N is compiled in: an off-table N is rendered again
    assert new["path"] == "rerender" and new["consts"] == {"N": 12288} and not new["build"]
    assert new["ws"]["dw_partial"] == 4 * min(77, new["params"]["groups"]) * 12288
    odd = out["odd_n"]  # no vectorized genome divides N = 1001
    assert odd["path"] == "repaired" and odd["params"]["vec"] == 1 and "vec 4->1" in odd["line"]
    assert "torch" in out["fwd"] and "no rmsnorm run was exported" in out["fwd"]
    assert ": torch:" in out["dout32"] and "dout float32" in out["dout32"]
    # the package renders the run's template as the factory does, and NVRTC builds it the same
    with Store.open(store, read_only=True) as s:
        text = s.sql("SELECT text FROM sources WHERE template = 'cluster_rows'").text[0]
    tdef = parse_template(text, "store", trusted=True)
    dtypes = {"x": "bfloat16", "w": "bfloat16"}
    ref = render(tdef, new["params"], 90, dtypes, {"N": 12288})
    assert ref.status.ok and out["new_n_source"] == ref.source
    g = Genome.make("rmsnorm_bwd", "cluster_rows", tdef.source_hash, new["params"])
    built = compile_one(prepare(tdef, g, "sm_90a", dtypes, {"M": 77, "N": 12288}))
    assert built.status.ok and out["new_n_cubin"] == hashlib.sha256(built.cubin).hexdigest()


def test_the_package_own_cpu_tests_pass_where_it_is_installed(installed, exported, tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(exported / "tests")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": str(installed)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


def test_without_the_run_nvrtc_the_export_is_refused(store, tmp_path, capsys):
    if compiler_version() == bx.NVRTC:
        pytest.skip(f"this NVRTC is the run's ({bx.NVRTC}): nothing to refuse")
    rc = main(["export", bx.RUN, "--store", str(store), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and f"built by {bx.NVRTC}" in err and "--nvrtc DIR" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    assert main(["export", bx.RUN, "--store", str(store), "--out", str(tmp_path / "o"), "--nvrtc", str(tmp_path)]) == 2
    assert "no NVRTC under" in capsys.readouterr().err


def test_a_measured_cubin_the_sources_no_longer_rebuild_is_refused(tmp_path, nvrtc, capsys):
    path = bx.copy_results(tmp_path / "r")
    entry = json.loads((bx.RESULTS / "dispatch.json").read_text())["dispatch"]["w=bf16,x=bf16 M32768-N65536"]
    with duckdb.connect(str(path)) as con:  # as if a _macros include had changed since the run
        key, cubin = con.execute("SELECT b.build_key, b.cubin FROM evaluations e JOIN builds b USING (build_key) "
                                 "WHERE e.run_id = ? AND e.genome_key = ? AND e.cell = 'w=bf16,x=bf16 M32768-N65536'",
                                 [bx.RUN, entry["genome_key"]]).fetchone()
        con.execute("UPDATE builds SET cubin = ? WHERE build_key = ?", [cubin[:-1] + bytes([cubin[-1] ^ 1]), key])
    assert main(["export", bx.RUN, "--store", str(path), "--out", str(tmp_path / "o"), *nvrtc]) == 2
    err = capsys.readouterr().err
    assert "M32768-N65536" in err and "compiles to another cubin than the one the run measured" in err
    assert not (tmp_path / "o").exists()


def test_the_run_template_text_is_exported_not_today_file(tmp_path):
    today = fx.TEMPLATES["cta_row"]
    cut = today.text.index("-#}") + 4
    text = today.text[:cut] + "// cta_row as this run recorded it\n" + today.text[cut:]
    recorded = {"cta_row": parse_template(text, "the run's cta_row", trusted=True)}
    plan = {("bf16", 4096, 1024): [(fx.WIN_1K, 4.0)]}
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        fx.write_run(s, fx.build_all(plan, recorded), plan=plan, templates=recorded)
    assert main(["export", fx.RUN, "--store", str(path), "--out", str(tmp_path / "o"), "--name", "kf_old"]) == 0
    op = _dispatch(tmp_path / "o", "kf_old")["ops"]["rmsnorm"]
    data = tmp_path / "o" / "kf_old" / "data"
    (b,) = op["builds"].values()
    assert "// cta_row as this run recorded it" in (data / b["cu"]).read_text() and b["cubin_from"] == "store"
    (t,) = op["templates"].values()
    assert (data / t["file"]).read_text() == text != today.text


def test_forward_and_backward_export_together(tmp_path, nvrtc):
    path = bx.copy_results(tmp_path / "r")  # the committed backward run, and a forward run beside it
    plan = {("bf16", 4096, 1024): [(fx.WIN_1K, 4.0)], ("bf16", 4096, 8192): [(fx.WIN_8K, 20.0)]}
    with Store.open(path) as s:
        fx.write_run(s, fx.build_all(plan), plan=plan)
    out = tmp_path / "both"
    assert main(["export", bx.RUN, fx.RUN, "--store", str(path), "--out", str(out), "--name", "kf_both", *nvrtc]) == 0
    assert set(_dispatch(out, "kf_both")["ops"]) == {"rmsnorm", "rmsnorm_bwd"}
    prov = json.loads((out / "kf_both" / "data" / "provenance.json").read_text())["ops"]
    assert {k["rebuilt_with"] for k in prov["rmsnorm"]["kernels"].values()} == {compiler_version()}
    assert {k["rebuilt_with"] for k in prov["rmsnorm_bwd"]["kernels"].values()} == {bx.NVRTC}
    readme = (out / "README.md").read_text()
    assert f"run `{fx.RUN}` (forward) and run `{bx.RUN}` (backward)" in readme
    assert "No forward run" not in readme and "No backward run" not in readme
    got = _child("import json, kf_both as kf\n"
                 "print(json.dumps([kf.explain(s, 'bf16', op=op).path for s, op in [((4096, 1024), 'rmsnorm'), "
                 "((32768, 8192), 'rmsnorm_bwd'), ((512, 8192), 'rmsnorm_bwd'), ((512, 8192), 'rmsnorm')]]))",
                 [out])
    assert got == ["table", "table", "table-build", "table-build"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": str(out)})
    assert r.returncode == 0 and " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-3000:]


def test_the_committed_store_is_not_touched():
    assert bx.committed_sha256() == COMMITTED

"""`kfactory export` of a plain RMSNorm forward run and a run of its variants (residual, bias, store_rstd:
cta_row_fused) into one package, on the CPU: the runs' tables merge into the op's one table, every call is
keyed by its variant, a variant call takes the variant's kernels (table, table-build, rerender, repaired)
or torch with a reason, the variant kernels' args are bound in the plan's order as the factory's gate
binds them, plain calls take exactly the paths an export of the plain run alone gives, and the package's
own CPU tests pass where it is pip-installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evo.build.nvrtc import NVRTC_STD, include_dir
from evo.cli.main import main
from evo.measure.evaluate import bind_cell
from evo.templates.render import render
from memory.store import Store
from evo.core.registry import get_op
from tests.unit import export_fixtures as fx
from tests.unit import variant_export_fixtures as vx
from tests.unit.export_fixtures import pip_install

NAME = "kf_var_test"
PLAIN_NAME = "kf_plain_test"
CHILD_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
TORCH_SITE = os.environ.get("KF_TEST_TORCH_PATH", "")  # extra sys.path entries with torch, for the API tests


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "s.duckdb"
    built = fx.build_all()
    with Store.open(path) as s:
        fx.write_run(s, built)
        vx.write_variant_run(s, vx.build_variants())
        fx.write_run(s, built, "exp-r2", plan={("bf16", 4096, 1024): [(fx.LOSE_1K, 5.0)]})
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory, store):
    out = tmp_path_factory.mktemp("pkg") / NAME
    assert main(["export", fx.RUN, vx.VAR_RUN, "--store", str(store), "--out", str(out), "--name", NAME]) == 0
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory, exported):
    return pip_install(exported, tmp_path_factory.mktemp("pip"))


@pytest.fixture(scope="module")
def plain_only(tmp_path_factory, store):
    """The plain run alone, exported and installed: what plain calls must still get."""
    out = tmp_path_factory.mktemp("plain") / PLAIN_NAME
    assert main(["export", fx.RUN, "--store", str(store), "--out", str(out), "--name", PLAIN_NAME]) == 0
    return pip_install(out, tmp_path_factory.mktemp("pip-plain"))


def _doc(exported: Path) -> dict:
    return json.loads((exported / NAME / "data" / "dispatch.json").read_text())["ops"]["rmsnorm"]


def _child(code: str, site: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=site,
                       check=False, env={**CHILD_ENV, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_the_two_runs_make_one_table_that_agrees_with_the_store(exported, store):
    doc, data = _doc(exported), exported / NAME / "data"
    assert doc["run_id"] == fx.RUN and doc["run_ids"] == [fx.RUN, vx.VAR_RUN]
    assert doc["dim_defaults"] == {"bias": 0, "store_rstd": 0}
    want = {fx.cell(dt, m, n).label(): fx.genome(*rows[0][0]).key() for (dt, m, n), rows in fx.PLAN.items()}
    want |= {c.label(): fx.genome(*rows[0][0]).key() for c, rows in vx.VAR_PLAN.items()}
    assert {e["cell"]: e["genome_key"] for e in doc["entries"]} == want
    with Store.open(store, read_only=True) as s:
        measured = s.sql("SELECT e.cell, b.cubin FROM evaluations e JOIN builds b USING (build_key) "
                         "WHERE e.run_id IN (?, ?) AND e.status = 'OK'", [fx.RUN, vx.VAR_RUN])
    cubin_of = {(r.cell, bytes(r.cubin)) for r in measured.itertuples(index=False)}
    for e in doc["entries"]:
        b = doc["builds"][e["build"]]
        assert (e["cell"], (data / b["cubin"]).read_bytes()) in cubin_of and b["cubin_from"] == "store"
    res = doc["builds"][next(e["build"] for e in doc["entries"] if e["cell"] == vx.RES_BF16_1K.label())]
    assert res["consts"] == {"N": 1024, "bias": 0, "store_rstd": 0} and res["dtypes"]["residual"] == "bfloat16"
    fused = next(t for t in doc["templates"].values() if t["name"] == "cta_row_fused")
    assert fused["launches"][0]["args"] == ["x", "residual?", "w", "bias?", "y", "residual_out?", "rstd?", "M", "eps"]
    prov = json.loads((data / "provenance.json").read_text())["ops"]["rmsnorm"]
    assert [r["run"]["run_id"] for r in prov["runs"]] == [fx.RUN, vx.VAR_RUN]
    assert sorted(prov["runs"][1]["cells"]) == sorted(c.label() for c in vx.VAR_PLAN)
    assert prov["cells"] == len(fx.PLAN) + len(vx.VAR_PLAN)
    csv = (data / "results" / "rmsnorm_evaluations.csv").read_text()
    assert fx.RUN in csv and vx.VAR_RUN in csv
    readme = (exported / "README.md").read_text()
    assert fx.RUN in readme and vx.VAR_RUN in readme and "## Variants" in readme and "cta_row_fused" in readme


def test_every_variant_source_compiles_for_sm_90a_to_the_shipped_cubin(exported):
    from cuda.core import Program, ProgramOptions

    doc, data = _doc(exported), exported / NAME / "data"
    opts = ProgramOptions(arch="sm_90a", std=NVRTC_STD, include_path=[include_dir()], ptxas_options=["-v"])
    fused = [b for b in doc["builds"].values() if b["template"].startswith("cta_row_fused-")]
    assert len(fused) == 7
    for b in fused:
        cubin = Program((data / b["cu"]).read_text(), code_type="c++", options=opts).compile("cubin").code
        assert bytes(cubin) == (data / b["cubin"]).read_bytes(), b["cu"]


_EXPLAIN = """
import json, sys
import {name} as kf
from {name}.args import bind_args
from {name}.loader import source_for
from {name}.table import tables
calls = {{
    "res": ((32768, 1024), "bf16", {{"residual": True}}), "res_m": ((37, 1024), "bf16", {{"residual": True}}),
    "res_n": ((5, 2048), "bf16", {{"residual": True}}), "res_odd": ((3, 1000), "bf16", {{"residual": True}}),
    "res_3d": ((2, 3, 4096), "bf16", {{"residual": True}}), "res_fp16": ((129, 1024), "fp16", {{"residual": True}}),
    "res32": ((19, 4096), "bf16", {{"residual": "fp32"}}), "res_other": ((37, 1024), "bf16", {{"residual": "fp16"}}),
    "bias": ((32768, 1024), "bf16", {{"bias": True}}), "bias_m": ((7, 1024), "bf16", {{"bias": True}}),
    "rstd": ((32768, 1024), "bf16", {{"store_rstd": True}}), "rstd_fp32": ((4096, 1024), "fp32", {{"store_rstd": True}}),
    "all": ((32768, 4096), "bf16", {{"residual": True, "bias": True, "store_rstd": True}}),
    "res_bias": ((37, 1024), "bf16", {{"residual": True, "bias": True}}),
    "bias_fp16": ((37, 1024), "fp16", {{"bias": True}}),
    "res_out": ((37, 1024), "bf16", {{"residual": True, "out_dtype": "fp32"}}),
}}
out = {{"torch_imported": "torch" in sys.modules}}
for k, (shape, dt, kw) in calls.items():
    c = kf.explain(shape, dt, arch=90, **kw)
    out[k] = {{"path": c.path, "params": dict(c.params), "consts": dict(c.consts), "dims": dict(c.dims),
               "dtypes": dict(c.dtypes), "build": c.build, "template": c.template, "line": str(c)}}
    if c.kernel:
        t = tables()["rmsnorm"].templates[c.template]
        launches, _ = t.plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))
        ptrs = {{n: 1000 + i for i, n in enumerate(("x", "w", "y", "residual", "residual_out", "bias", "rstd"))
                if n in ("x", "w", "y") or ((n in ("residual", "residual_out")) and "residual" in dict(c.dtypes))
                or (n == "bias" and dict(c.dims).get("bias")) or (n == "rstd" and dict(c.dims).get("store_rstd"))}}
        out[k]["args"] = [[float(a) for a in bind_args(ln.args, ptrs, dict(c.dims), {{"eps": 1e-6}},
                                                        dict(tables()["rmsnorm"].scalars), c.template)]
                          for ln in launches]
        out[k]["ptrs"] = ptrs
        out[k]["grid"] = [list(ln.grid) for ln in launches]
        out[k]["source"] = source_for(tables()["rmsnorm"], c)
print(json.dumps(out))
"""


def test_variant_calls_take_the_variant_kernels_or_torch_with_a_reason(installed):
    out = _child(_EXPLAIN.format(name=NAME), installed)
    assert not out["torch_imported"]
    fused = {k: v for k, v in out.items() if k != "torch_imported" and v["path"] != "torch"}
    assert all(v["template"].startswith("cta_row_fused-") for k, v in fused.items() if k != "rstd_fp32")
    assert (out["res"]["path"], out["res"]["dtypes"]) == ("table", {"residual": "bfloat16", "w": "bfloat16",
                                                                    "x": "bfloat16"})
    assert out["res"]["params"] == vx.N1K[1] and out["res"]["consts"] == {"N": 1024, "bias": 0, "store_rstd": 0}
    assert out["res_m"]["path"] == "table-build" and out["res_m"]["build"] == out["res"]["build"]
    assert out["res_n"]["path"] == "rerender" and out["res_n"]["consts"] == {"N": 2048, "bias": 0, "store_rstd": 0}
    assert out["res_odd"]["path"] == "repaired" and "->" in out["res_odd"]["line"]
    assert out["res_3d"]["path"] == "table-build" and out["res_3d"]["dims"] == {"M": 6, "N": 4096}
    assert out["res_fp16"]["path"] == "table-build" and out["res_fp16"]["dtypes"]["residual"] == "float16"
    assert out["res32"]["path"] == "table-build" and out["res32"]["dtypes"]["residual"] == "float32"
    assert out["res_other"]["path"] == "torch" and "x/residual bf16/fp16" in out["res_other"]["line"]
    assert (out["bias"]["path"], out["bias"]["dims"]) == ("table", {"M": 32768, "N": 1024, "bias": 1})
    assert out["bias_m"]["path"] == "table-build" and out["bias_m"]["consts"]["bias"] == 1
    assert out["rstd"]["path"] == "table" and out["rstd"]["consts"] == {"N": 1024, "bias": 0, "store_rstd": 1}
    assert out["all"]["path"] == "table" and out["all"]["consts"] == {"N": 4096, "bias": 1, "store_rstd": 1}
    assert out["res_bias"]["path"] == "torch" and "residual bf16 + bias: no exported cell has this variant" in \
        out["res_bias"]["line"]
    assert out["bias_fp16"]["path"] == "torch" and "bias with x/residual fp16" in out["bias_fp16"]["line"]
    assert out["res_out"]["path"] == "torch" and "out_dtype float32" in out["res_out"]["line"]
    # store_rstd in fp32: no such cell; the plain kernel, rstd by torch (as the plain op always did)
    assert out["rstd_fp32"]["path"] == "table" and "rstd computed by torch" in out["rstd_fp32"]["line"]
    assert "residual=bf16" in out["res"]["line"] and "bias=1 store_rstd=1" in out["all"]["line"]


def test_the_variant_kernels_args_are_bound_as_the_factory_gate_binds_them(installed):
    """The package binds each launch's args in the template's plan order: the call's variant tensors at
    their "name?" args, null pointers at the others, then M and eps, as evo.measure.evaluate.bind_cell."""
    out = _child(_EXPLAIN.format(name=NAME), installed)
    spec = get_op("rmsnorm")
    cells = {"res": vx.RES_BF16_1K, "bias": vx.BIAS_1K, "rstd": vx.RSTD_1K, "all": vx.ALL_4K, "res32": None}
    for k, c in cells.items():
        got = out[k]
        if c is None:
            c = fx.cell("bf16", 19, 4096, residual="fp32")
        tdef = fx.TEMPLATES["cta_row_fused"]
        jobs, buffers, _ = bind_cell(spec, tdef, fx.genome("cta_row_fused", got["params"]), c, 90)
        want = [[got["ptrs"][v] if kind == "buf" else (0 if kind == "ptr" else v) for kind, v in job.args]
                for job in jobs]
        assert [[int(a) if float(a).is_integer() else a for a in args] for args in got["args"]] == \
            [[int(a) if float(a).is_integer() else pytest.approx(a) for a in args] for args in want], k
        assert {b.name for b in buffers} == set(got["ptrs"]), k  # the same tensors, no more, no fewer
        assert got["grid"] == [list(j.grid) for j in jobs], k


def test_a_rerendered_variant_source_is_the_factory_source(installed):
    out = _child(_EXPLAIN.format(name=NAME), installed)
    for k, c in (("res_n", fx.cell("bf16", 5, 2048, residual=True)), ("res_odd", fx.cell("bf16", 3, 1000, residual=True))):
        ref = render(fx.TEMPLATES["cta_row_fused"], out[k]["params"], 90, c.dtypes_dict(),
                     fx.TEMPLATES["cta_row_fused"].consts(c.dims_dict()))
        assert ref.status.ok and out[k]["source"] == ref.source, k


_PLAIN = """
import json
import {name} as kf
shapes = [((4096, 1024), "bf16", None), ((77, 1024), "bf16", None), ((77, 2048), "bf16", None), ((5, 3000), "fp32", None),
          ((3, 33), "bf16", None), ((2, 3, 8192), "bf16", None), ((32768, 1024), "bf16", None), ((1, 4096), "fp16", None),
          ((19, 2048), "bf16", "fp32"), ((37, 4100), "fp16", None), ((4096, 1024), "bf16", "bf16")]
out = [str(kf.explain(s, d, w, arch=a)) for s, d, w in shapes for a in (90, 100)]
out += [str(kf.explain((64, 1024), "bf16", weight=False, residual_dtype="fp32", arch=90))]
print(json.dumps(out))
"""


def test_plain_calls_take_the_paths_of_an_export_of_the_plain_run_alone(installed, plain_only):
    both = _child(_PLAIN.format(name=NAME), installed)
    alone = _child(_PLAIN.format(name=PLAIN_NAME), plain_only)
    assert both == alone and all("cta_row_fused" not in line for line in both)


def test_an_export_of_the_variant_run_alone_serves_plain_calls_by_its_template(store, tmp_path):
    out = tmp_path / "var"
    assert main(["export", vx.VAR_RUN, "--store", str(store), "--out", str(out), "--name", "kf_only_var"]) == 0
    code = ("import json, kf_only_var as kf\n"
            "print(json.dumps([str(kf.explain((37, 1024), 'bf16', arch=90)), str(kf.explain((37, 1024), 'bf16', "
            "residual=True, arch=90))]))")
    plain, res = _child(code, out)
    assert ": rerender: cta_row_fused-" in plain and "M=37 N=1024 sm_90" in plain, plain
    assert ": table-build: cta_row_fused-" in res, res


def test_the_package_own_cpu_tests_pass_where_it_is_installed(installed, exported, tmp_path):
    path = os.pathsep.join(p for p in (str(installed), TORCH_SITE) if p)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(exported / "tests")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": path})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.parametrize("runs,words", [
    ([fx.RUN, "exp-r2"], "2 runs of op rmsnorm given (exp-r1, exp-r2), and cell 'w=bf16,x=bf16 M4096-N1024' is in"),
    ([fx.RUN, vx.VAR_RUN, "exp-r2"], "3 runs of op rmsnorm given"),
], ids=["shared-cell", "three-runs-one-shared-cell"])
def test_runs_of_one_op_with_a_cell_in_common_are_refused(store, tmp_path, capsys, runs, words):
    out = tmp_path / "pkg"
    assert main(["export", *runs, "--store", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()

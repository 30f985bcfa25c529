"""`kfactory export` of a KDA run on the CPU: a store with a finished decode run (the real recurrent
template, real sm_90a builds) becomes a package served by ops/kda/export, whose files agree with the
store (the measured cubins, byte for byte), which pip installs and imports without a GPU or torch, whose
explain() names fla's entry points' paths, and whose own CPU tests pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.export import family as fam
from memory.store import Store
from tests.unit import kda_export_fixtures as kx
from tests.unit.export_fixtures import pip_install

NAME = "kf_kda_test"
CHILD_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
TORCH_SITE = os.environ.get("KF_TEST_TORCH_PATH", "")  # extra sys.path entries with torch, for the API tests


def run_package_tests(pkg: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    """The exported package's own tests (`pkg`/tests), run where it is installed (`site`, and torch if given)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(pkg / "tests")],
                          capture_output=True, text=True, timeout=600, cwd=cwd, check=False,
                          env={**CHILD_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(site), TORCH_SITE) if p)})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "s.duckdb"
    with Store.open(path) as s:
        kx.write_run(s, kx.build_all())
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory, store):
    out = tmp_path_factory.mktemp("pkg") / NAME
    assert main(["export", kx.RUN, "--store", str(store), "--out", str(out), "--name", NAME]) == 0
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory, exported):
    return pip_install(exported, tmp_path_factory.mktemp("pip"))


def test_the_kda_family_serves_kda():
    f = fam.find_family("kda")
    assert f.module == "ops.kda.export" and dict(f.ops) == {"kda": "forward"} and f.name == "kf_kda"
    assert (f.runtime / "package" / "api.py").is_file() and (f.runtime / "package" / "choose.py").is_file()


def test_files_agree_with_the_store(exported, store):
    doc = json.loads((exported / NAME / "data" / "dispatch.json").read_text())["ops"]["kda"]
    data = exported / NAME / "data"
    winners = {c.label(): kx.genome(*rows[0][0]).key() for c, rows in kx.PLAN.items()}
    assert {e["cell"]: e["genome_key"] for e in doc["entries"]} == winners
    assert len(doc["builds"]) == 3  # WIN at B1/16/64, WIDE at B256, WIN with qk_l2norm and sigmoid beta
    with Store.open(store, read_only=True) as s:
        measured = s.sql("SELECT e.cell, b.cubin FROM evaluations e JOIN builds b USING (build_key) "
                         "WHERE e.run_id = ? AND e.status = 'OK'", [kx.RUN])
    cubin_of = {(r.cell, bytes(r.cubin)) for r in measured.itertuples(index=False)}
    for e in doc["entries"]:
        b = doc["builds"][e["build"]]
        assert (e["cell"], (data / b["cubin"]).read_bytes()) in cubin_of  # the very binary the run measured
        assert b["cubin_from"] == "store" and e["baseline"] == "fla.fused_recurrent_kda"
    variant = next(b for b in doc["builds"].values() if b["consts"]["qk_l2norm"] == 1)
    assert variant["consts"] == {"K": 128, "V": 128, "beta_act": 1, "qk_l2norm": 1}
    assert [s["name"] for s in doc["scalars"]] == ["scale", "lower_bound", "gate", "beta_act", "qk_l2norm", "v_first"]
    assert (data / "templates" / "_macros" / "memory.cuh.j2").exists()
    readme = (exported / "README.md").read_text()
    assert kx.RUN in readme and "fused_recurrent_kda" in readme and "MissingKernel" in readme
    assert {p.name for p in (exported / "tests").iterdir()} == {"conftest.py", "test_launch.py", "test_cpu.py", "test_gpu.py"}
    assert {p.name for p in (exported / NAME).glob("*.py")} >= {"api.py", "choose.py", "run.py", "bench.py",
                                                                 "verify.py", "reference.py", "loader.py"}


_CHILD = """
import json, sys
import kf_kda_test as kf
out = {"torch_imported": "torch" in sys.modules, "cuda_core_imported": "cuda.core" in sys.modules}
calls = {
    "table": dict(q_shape=(64, 1, 32, 128)),
    "table-build": dict(q_shape=(5, 1, 32, 128)),
    "wide": dict(q_shape=(256, 1, 32, 128)),
    "variant": dict(q_shape=(16, 1, 32, 128), use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True),
    "neg-eigval": dict(q_shape=(16, 1, 32, 128), use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "rerender": dict(q_shape=(8, 1, 4, 64), v_shape=(8, 1, 4, 64)),
    "gate": dict(q_shape=(16, 1, 32, 128), use_gate_in_kernel=True),
    "varlen": dict(q_shape=(1, 9, 32, 128), n_seqs=3),
    "chunk": dict(q_shape=(1, 8192, 32, 128), entry="chunk_kda"),
}
for name, kw in calls.items():
    c = kf.explain(arch=90, **kw)
    out[name] = {"path": c.path, "consts": dict(c.consts), "params": dict(c.params), "line": str(c)}
print(json.dumps(out))
"""


def test_installed_package_imports_without_a_gpu_and_explains_its_paths(installed):
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, cwd=installed,
                       check=False, env={**CHILD_ENV, "PYTHONPATH": str(installed)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert not out["torch_imported"] and not out["cuda_core_imported"]
    assert out["table"]["path"] == "table" and out["table"]["params"]["v_tile"] == 32
    assert out["table-build"]["path"] == "table-build"
    assert out["wide"]["path"] == "table" and out["wide"]["params"]["v_tile"] == 64
    assert out["variant"]["path"] == "table"
    assert out["neg-eigval"]["path"] == "rerender" and out["neg-eigval"]["consts"]["beta_act"] == 2
    assert out["rerender"]["path"] in ("rerender", "repaired") and out["rerender"]["consts"]["K"] == 64
    assert out["gate"]["path"] == "torch" and "gate_is_log_space" in out["gate"]["line"]
    assert out["varlen"]["path"] == "table-build"  # the recurrent template reads cu_seqlens at run time
    assert out["chunk"]["path"] == "missing" and "chunk" in out["chunk"]["line"]
    assert out["chunk"]["line"].startswith("chunk_kda ")


def test_the_package_own_cpu_tests_pass_where_it_is_installed(installed, exported, tmp_path):
    r = run_package_tests(exported, installed, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


def test_a_kda_run_and_a_rmsnorm_run_are_refused_together(store, tmp_path, capsys):
    from tests.unit import export_fixtures as fx

    plan = {("bf16", 4096, 1024): [(fx.WIN_1K, 4.0)]}
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        kx.write_run(s, kx.build_all())
        fx.write_run(s, fx.build_all(plan), plan=plan)
    assert main(["export", kx.RUN, fx.RUN, "--store", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "different exporters" in capsys.readouterr().err and not (tmp_path / "o").exists()


_BOTH = """
import json
import kf_kda_both as kf
d = dict(__import__("json").loads(%r))
out = {}
for entry, dims in d.items():
    c = kf.explain(entry=entry, arch=90, **dims)
    out[entry] = {"path": c.path, "template": c.template, "line": str(c)}
print(json.dumps(out))
"""


def test_a_decode_run_and_a_prefill_run_export_into_one_package(store, tmp_path):
    """ops/kda/export MERGE: the decode run and a prefill run (no cell in common) become one package whose
    fused_recurrent_kda and chunk_kda both take their run's kernels, with both runs in its provenance."""
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        kx.write_run(s, kx.build_all())
        g = kx.write_prefill_run(s)
    out = tmp_path / "kf_kda_both"
    assert main(["export", kx.RUN, kx.PREFILL_RUN, "--store", str(path), "--out", str(out), "--name", "kf_kda_both"]) == 0
    doc = json.loads((out / "kf_kda_both" / "data" / "dispatch.json").read_text())
    entries = {e["cell"]: e for e in doc["ops"]["kda"]["entries"]}
    assert entries[kx.PREFILL_CELL.label()]["genome_key"] == g.key()
    assert {c.label() for c in kx.PLAN} < set(entries)
    assert {t["name"] for t in doc["ops"]["kda"]["templates"].values()} == {"recurrent", "chunk"}
    prov = json.loads((out / "kf_kda_both" / "data" / "provenance.json").read_text())
    assert kx.RUN in json.dumps(prov) and kx.PREFILL_RUN in json.dumps(prov)
    site = pip_install(out, tmp_path / "pip")
    pd_, dd = kx.PREFILL_CELL.dims_dict(), kx.decode(64).dims_dict()
    shapes = {"chunk_kda": {"q_shape": [pd_["B"], pd_["T"], pd_["H"], pd_["K"]],
                            "v_shape": [pd_["B"], pd_["T"], pd_["HV"], pd_["V"]]},
              "fused_recurrent_kda": {"q_shape": [dd["B"], dd["T"], dd["H"], dd["K"]],
                                      "v_shape": [dd["B"], dd["T"], dd["HV"], dd["V"]]}}
    r = subprocess.run([sys.executable, "-c", _BOTH % json.dumps(shapes)], capture_output=True, text=True,
                       timeout=300, cwd=site, check=False, env={**CHILD_ENV, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["chunk_kda"]["path"] == "table" and got["chunk_kda"]["template"].startswith("chunk-"), got
    assert got["fused_recurrent_kda"]["path"] == "table", got
    assert got["fused_recurrent_kda"]["template"].startswith("recurrent-"), got
    text = (out / "README.md").read_text()
    assert "**This export has none**" not in text
    r = run_package_tests(out, site, tmp_path)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_readme_says_which_entry_points_have_kernels(exported):
    text = (exported / "README.md").read_text()
    assert "**This export has none**" in text and "recurrent" in text
    assert Path(exported / "pyproject.toml").read_text().count("kf-kda-test") == 1


# the K-split carry recurrence, as kda_prefill_h100_5's winner
KSPLIT_CARRY = {"chunk": 32, "kwarps": 2, "warps": 2, "recur_addr": "carry"}


def test_a_prefill_only_package_passes_its_own_tests(tmp_path):
    """A package of a prefill run alone (no decode cell): its own tests start from the prefill cell and call
    chunk_kda. They indexed the first decode cell and failed four ways on the GPU (the export of a prefill run
    alone); the CPU one among them is checked here. The package's plan sizes u's workspace by the template's
    expression (4 bytes an element), evaluated by the package's own evaluator. (A
    prefill winner at the default point is exported, installed and its package tested with the decode run:
    test_a_decode_run_and_a_prefill_run_export_into_one_package.)"""
    params = KSPLIT_CARRY
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        g = kx.write_prefill_run(s, params=params)
    out = tmp_path / "kf_kda_prefill"
    assert main(["export", kx.PREFILL_RUN, "--store", str(path), "--out", str(out), "--name", "kf_kda_prefill"]) == 0
    doc = json.loads((out / "kf_kda_prefill" / "data" / "dispatch.json").read_text())
    assert {t["name"] for t in doc["ops"]["kda"]["templates"].values()} == {"chunk"}
    (entry,) = doc["ops"]["kda"]["entries"]
    assert entry["genome_key"] == g.key()
    site = pip_install(out, tmp_path / "pip")
    d = kx.PREFILL_CELL.dims_dict()
    code = ("import json, sys; from kf_kda_prefill.table import tables; e = json.loads(sys.argv[1]); "
            "t = tables()['kda'].templates[e['template']]; "
            "print(t.plan(e['params'], 90, json.loads(sys.argv[2]), json.loads(sys.argv[3]))[1]['ws_u'])")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(entry), json.dumps(kx.PREFILL_CELL.dtypes_dict()),
                        json.dumps(d)], capture_output=True, text=True, timeout=120, cwd=site, check=False,
                       env={**CHILD_ENV, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    chunks = d["B"] * d["HV"] * -(-d["T"] // g.params_dict()["chunk"])
    assert int(r.stdout) == 4 * chunks * g.params_dict()["chunk"] * d["V"]
    r = run_package_tests(out, site, tmp_path)
    assert r.returncode == 0 and " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    assert "no decode cell exported" in r.stdout  # the decode-only checks skip, naming why

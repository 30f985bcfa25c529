"""The GPU machine scripts name files that exist (a typo is otherwise found only on the GPU machine), and the
package proof's wheels stage installs what it is given."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "experiments" / "scripts").glob("*.sh"))
PATH = re.compile(r"(?<![\w/$.-])((?:experiments|tests|ops|templates)/[\w./-]+\.(?:toml|py|json|txt|duckdb)(?:\.gz)?)")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_path_a_gpu_script_names_exists(script):
    paths = set(PATH.findall(script.read_text()))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{script.name} names missing files: {missing}"


def test_the_lab_gpu_script_names_its_inputs():
    """The pattern finds what the script uses (so the test above checks something)."""
    found = set(PATH.findall((ROOT / "experiments" / "scripts" / "lab_gpu.sh").read_text()))
    assert {"experiments/rmsnorm_bwd_h200_all.toml", "experiments/rmsnorm_residual_h200.toml",
            "tests/gpu/test_kda_device.py", "tests/fixtures/results/rmsnorm_bwd_h200/store.duckdb.gz"} <= found


@pytest.mark.parametrize("gpu, rc", [("NVIDIA H100 80GB HBM3", 3), ("NVIDIA H200", 0)])
def test_lab_gpu_script_runs_nothing_on_another_gpu_than_required(tmp_path, gpu, rc):
    """KF_REQUIRE_GPU=H200: on an H100 the script exits 3 before creating its output folder; on an H200 it goes on
    (the `stash` stage, which only lists the wheel pieces)."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{gpu}'\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KF_REQUIRE_GPU": "H200"}
    p = subprocess.run(["bash", "experiments/scripts/lab_gpu.sh", "stash", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == rc, p.stdout + p.stderr
    assert out.exists() is (rc == 0)
    if rc:
        assert "not a H200" in p.stdout


def test_lab_gpu_script_seeds_and_saves_the_triton_cache(tmp_path):
    """A Triton cache brought along ($KF_TRITON_SEED) is copied into TRITON_CACHE_DIR; KF_SAVE_TRITON_CACHE=1 packs that
    folder into $out/triton_cache.tgz when the script ends (here after the `stash` stage)."""
    import os
    import subprocess
    import tarfile

    seed = tmp_path / "seed" / "ab12"
    seed.mkdir(parents=True)
    (seed / "kernel.cubin").write_bytes(b"cubin bytes")
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = {**os.environ, "KF_TRITON_SEED": str(tmp_path / "seed"), "KF_TRITON_DIR": str(cache),
           "KF_SAVE_TRITON_CACHE": "1"}
    env.pop("KF_REQUIRE_GPU", None)
    p = subprocess.run(["bash", "experiments/scripts/lab_gpu.sh", "stash", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (cache / "ab12" / "kernel.cubin").read_bytes() == b"cubin bytes"
    with tarfile.open(out / "triton_cache.tgz") as t:
        assert "./ab12/kernel.cubin" in t.getnames()
    env.pop("KF_SAVE_TRITON_CACHE")
    p = subprocess.run(["bash", "experiments/scripts/lab_gpu.sh", "stash", str(tmp_path / "out2")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not (tmp_path / "out2" / "triton_cache.tgz").exists()


def test_lab_gpu_script_seeds_the_triton_cache_from_a_packed_one(tmp_path):
    """A packed cache, $KF_TRITON_SEED.tgz (what KF_SAVE_TRITON_CACHE wrote: one file to copy instead of many), is
    unpacked into TRITON_CACHE_DIR."""
    import os
    import subprocess
    import tarfile

    packed = tmp_path / "src" / "cd34"
    packed.mkdir(parents=True)
    (packed / "kernel.json").write_text("{}")
    with tarfile.open(tmp_path / "seed.tgz", "w:gz") as t:
        t.add(tmp_path / "src", arcname=".")
    cache = tmp_path / "cache"
    env = {**os.environ, "KF_TRITON_SEED": str(tmp_path / "seed"), "KF_TRITON_DIR": str(cache)}
    env.pop("KF_REQUIRE_GPU", None)
    env.pop("KF_SAVE_TRITON_CACHE", None)
    p = subprocess.run(["bash", "experiments/scripts/lab_gpu.sh", "stash", str(tmp_path / "out")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (cache / "cd34" / "kernel.json").read_text() == "{}"


def _wheel(folder: Path, dist: str, files: dict[str, str]) -> Path:
    """A minimal wheel of `dist` 1.0 holding `files` (path -> text)."""
    import zipfile

    info = f"{dist}-1.0.dist-info"
    w = folder / f"{dist}-1.0-py3-none-any.whl"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n",
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            f"{info}/RECORD": ""}
    with zipfile.ZipFile(w, "w") as z:
        for name, text in {**files, **meta}.items():
            z.writestr(name, text)
    return w


def test_package_proof_wheels_joins_pieces_and_merges_calls_into_one_site(tmp_path):
    """A wheel split into NAME.whl.part.* is joined, and wheels sharing a top folder installed by two calls both land
    in it (pip --target alone would skip the second: the CUTLASS DSL's core and its libraries)."""
    import os
    import subprocess

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _wheel(a, "ns_core", {"ns/core.py": "X = 1\n"})
    whole = _wheel(tmp_path, "ns_libs", {"ns/libs/lib.py": "Y = 2\n"}).read_bytes()
    half = len(whole) // 2
    (b / "ns_libs-1.0-py3-none-any.whl.part.aa").write_bytes(whole[:half])
    (b / "ns_libs-1.0-py3-none-any.whl.part.ab").write_bytes(whole[half:])
    site = tmp_path / "site"
    env = {**os.environ, "KF_SITE": str(site), "KF_PROOF_STATE": str(tmp_path / "state")}
    for d in (a, b):
        r = subprocess.run(["bash", str(ROOT / "experiments/scripts/package_proof.sh"), "wheels", str(d)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert (site / "ns" / "core.py").is_file() and (site / "ns" / "libs" / "lib.py").is_file()


def test_package_proof_all_stops_where_its_time_runs_out_and_names_the_next_step(tmp_path):
    import os
    import subprocess

    (tmp_path / "demo.env").write_text('STORE=x\nRUNS=r\nNAME=kf_demo\nBENCHES=("t1 --samples 5")\n')
    env = {**os.environ, "KF_PACKAGES": str(tmp_path), "KF_PROOF_STATE": str(tmp_path / "state"),
           "KF_SITE": str(tmp_path / "site")}
    proof = str(ROOT / "experiments/scripts/package_proof.sh")
    r = subprocess.run(["bash", proof, "all", str(tmp_path / "out"), "30"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "next: install demo (call again to go on)" in r.stdout, r.stdout + r.stderr
    (tmp_path / "state" / "install_demo.done").touch()  # done steps are skipped: the bench comes next
    r = subprocess.run(["bash", proof, "all", str(tmp_path / "out"), "30"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert "next: bench demo t1" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["bash", proof, "all", str(tmp_path / "out"), "soon"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "SECONDS must be a whole number, got soon" in r.stderr


def test_both_gpu_scripts_list_their_stages_under_help():
    """--help prints each script's header, and it names every stage the script takes (nothing is run or made)."""
    lab = subprocess.run(["bash", "experiments/scripts/lab_gpu.sh", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert lab.returncode == 0 and lab.stdout.startswith("The search runs")
    src = (ROOT / "experiments/scripts/lab_gpu.sh").read_text()
    stages = re.search(r"stages=\$\{1:\?([^}]*)\}", src)[1].replace(" or ", ", ").split(", ")
    assert len(stages) > 20 and all(re.search(rf"\b{s} OUT\b", lab.stdout) for s in stages), stages
    proof = subprocess.run(["bash", "experiments/scripts/package_proof.sh", "--help"], cwd=ROOT, capture_output=True,
                           text=True)
    assert proof.returncode == 0 and all(f"package_proof.sh {s} " in proof.stdout
                                         for s in ("wheels", "source", "export", "install", "tests", "bench", "all"))
    missing = subprocess.run(["bash", "experiments/scripts/package_proof.sh", "source", "/nonexistent"], cwd=ROOT,
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "flashkda-*.tar.gz" in missing.stderr


def test_the_package_stages_take_each_configs_newest_finished_run(tmp_path):
    """newest_runs.py (lab_gpu.sh's rmspackage and kdapackage): per run name its newest finished run, never a run
    of a longer name that starts the same ("a" is not "a-best"), "A|B" falling back to B, a name without one left
    out."""
    import importlib.util

    from memory import Store
    from tests.unit.test_store import run_row

    spec = importlib.util.spec_from_file_location("newest_runs", ROOT / "experiments" / "scripts" / "newest_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = [("a-20261201-000000-aaaaaa", "done"), ("a-best-20261209-000000-bbbbbb", "done"),
            ("a-20261203-000000-cccccc", "failed"), ("b-best-20261202-000000-dddddd", "done")]
    with Store.open(tmp_path / "s.duckdb") as s:
        s.write([run_row(r, status=st) for r, st in runs])
    got = mod.newest_runs(str(tmp_path / "s.duckdb"), ["a", "b|b-best", "c", "a-best"])
    assert got == ["a-20261201-000000-aaaaaa", "b-best-20261202-000000-dddddd", "a-best-20261209-000000-bbbbbb"]

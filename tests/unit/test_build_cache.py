"""The build cache on disk ($KF_BUILD_CACHE): a build key NVRTC answered once is answered from the folder, by any
process; what is derived from NVRTC's answer (resources, the launch-limit check) is derived again; a refused compile
is kept too; an entry cut short, or a folder unset, is a miss; a killed compile is never kept."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from evo.build import cache as build_cache
from evo.build import nvrtc
from evo.build.nvrtc import Builder, compile_one, prepare
from evo.core.genome import Genome
from evo.core.status import Status
from tests.unit.test_render_build import TEMPLATES, _slow_inputs, _tdef


def _input(dt: str = "float32"):
    tdef = TEMPLATES["warp_row"]
    g = Genome.make("rmsnorm", "warp_row", tdef.source_hash, tdef.default_params())
    return prepare(tdef, g, "sm_90a", {"x": dt, "w": dt}, {})


def _no_nvrtc(bi):
    raise AssertionError("NVRTC was called for a cached build key")


def test_a_cached_key_is_answered_without_nvrtc_and_its_resources_derived_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(build_cache.ENV, str(tmp_path))
    bi = _input()
    first = compile_one(bi)
    assert first.status is Status.OK and first.regs > 0
    entry = build_cache.load(bi.key())
    assert entry is not None and entry.ok and entry.cubin == first.cubin and entry.log == first.log
    monkeypatch.setattr(nvrtc, "_nvrtc", _no_nvrtc)
    again = compile_one(bi)
    assert again == first  # the same record, field by field
    # derived again, not stored: a launch with more threads than the registers allow is refused from the cache
    big = replace(bi, threads=65536 // first.regs + 1, kernel_threads=())
    assert compile_one(big).status is Status.RESOURCE_ERROR
    with pytest.raises(AssertionError, match="NVRTC was called"):
        compile_one(_input("float16"))  # another key: a miss
    path = tmp_path / bi.key()[:2] / bi.key()
    path.write_bytes(path.read_bytes()[:-100])  # a cubin cut short
    assert build_cache.load(bi.key()) is None


def test_a_refused_compile_is_kept_and_a_cut_entry_is_a_miss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(build_cache.ENV, str(tmp_path))
    tdef = _tdef('extern "C" __global__ void k(float* x) { x[0] = undeclared_symbol; }\n')
    bad = prepare(tdef, Genome.make("rmsnorm", "evil", tdef.source_hash, {"threads": 128}), "sm_90a",
                  {"x": "float32", "w": "float32"}, {})
    r = compile_one(bad)
    assert r.status is Status.COMPILE_ERROR and "undeclared_symbol" in r.error
    monkeypatch.setattr(nvrtc, "_nvrtc", _no_nvrtc)
    assert compile_one(bad) == r
    path = tmp_path / bad.key()[:2] / bad.key()
    path.write_bytes(path.read_bytes()[:-1])  # the header's end (no cubin follows a refused compile)
    assert build_cache.load(bad.key()) is None
    path.write_bytes(b"not json\n")
    assert build_cache.load(bad.key()) is None
    with pytest.raises(ValueError, match="not a build key"):
        build_cache.load("../../etc/passwd")


def test_unset_caches_nothing_and_a_killed_compile_is_not_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(build_cache.ENV, "")
    assert build_cache.cache_dir() is None
    compile_one(_input())
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv(build_cache.ENV, str(tmp_path))
    (slow,) = _slow_inputs(18)
    with Builder(workers=1, timeout_s=0.5) as b:  # its compile process inherits the folder
        (r,) = b.build([slow])
    assert r.status is Status.COMPILE_ERROR and "exceeded" in r.error
    assert build_cache.load(slow.key()) is None

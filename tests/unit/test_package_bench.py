"""The exported benchmark's shared parts without a GPU: each side checked before it is timed (absent, failed, wrong
and correct sides; only correct ones timed), the verdict against the fastest correct peer by kernel and by call
time, the timer's sample-by-sample turns (kernel time with the stream held, call time from an idle GPU), and the
document a benchmark writes (where it ran, the copy ceiling, the rows kept after every cell)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from evo.export.runtime.package import benchmark, sides


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None)))


def test_only_correct_sides_are_timed_and_each_other_says_why(fake_cuda, monkeypatch):
    timed = []

    def fake_timer(fns, n):
        timed.append([f() for f in fns])
        return ([[10.0] * n, [20.0] * n, [5.0] * n][:len(fns)], [[30.0] * n, [25.0] * n, [40.0] * n][:len(fns)],
                [[4.0] * n, [3.0] * n, [6.0] * n][:len(fns)])

    monkeypatch.setitem(sys.modules, "evo.export.runtime.package.timing",
                        SimpleNamespace(kernel_and_call_us=fake_timer))

    def boom():
        raise RuntimeError("CUDA error: invalid argument\nmore")

    out = sides.compare({"package": lambda: "good", "torch.eager": lambda: "good", "liger": lambda: "bad",
                         "quack": boom, "flashinfer": "not installed: No module named 'flashinfer'"},
                        lambda name, got: "" if got == "good" else f"y: 3 of 9 off ({name})", nbytes=10_000, samples=4,
                        ceiling_gbps=2.0)
    s = out["sides"]
    assert s["flashinfer"] == {"status": "absent", "reason": "not installed: No module named 'flashinfer'"}
    assert s["quack"] == {"status": "failed", "reason": "RuntimeError: CUDA error: invalid argument"}
    assert s["liger"] == {"status": "wrong", "reason": "y: 3 of 9 off (liger)"}
    assert timed == [["good", "good"]]  # the wrong, failed and absent sides never reach the timer
    assert s["package"]["kernel_us"] == 10.0 and s["package"]["call_us"] == 30.0 and s["package"]["samples"] == 4
    assert s["package"]["host_us"] == 4.0 and s["torch.eager"]["host_us"] == 3.0
    assert s["package"]["gbps"] == pytest.approx(1.0) and s["package"]["pct_ceiling"] == pytest.approx(50.0)
    assert out["correct"] and out["best_peer_kernel"] == "torch.eager" and out["speedup_kernel"] == pytest.approx(2.0)
    assert out["best_peer_call"] == "torch.eager" and out["speedup_call"] == pytest.approx(25 / 30)


def test_the_verdict_picks_the_fastest_correct_peer_per_column_and_none_without_one():
    st = {"package": {"status": "ok", "kernel_us": 10.0, "call_us": 20.0},
          "a": {"status": "ok", "kernel_us": 12.0, "call_us": 50.0},
          "b": {"status": "ok", "kernel_us": 15.0, "call_us": 16.0},
          "c": {"status": "wrong", "reason": "x"}}
    v = sides.verdict(st)
    assert (v["best_peer_kernel"], v["best_peer_call"]) == ("a", "b")
    assert v["speedup_kernel"] == pytest.approx(1.2) and v["speedup_call"] == pytest.approx(0.8)
    alone = sides.verdict({"package": {"status": "wrong", "reason": "y"}, "a": st["a"]})
    assert not alone["correct"] and alone["speedup_kernel"] is None and alone["best_peer_kernel"] == "a"
    # another path of the package's own (a diagnostic side) is no peer, however fast
    own = sides.verdict({**st, "package.split16": {"status": "ok", "kernel_us": 1.0, "call_us": 2.0}})
    assert (own["best_peer_kernel"], own["best_peer_call"]) == ("a", "b")


def test_the_document_says_where_it_ran_and_keeps_rows_after_every_cell(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True)))
    import evo.export.runtime.package.environment as env

    monkeypatch.setattr(env, "environment", lambda dists: {"card": {"name": "Fake H100"}, "peers": dict.fromkeys(dists)})
    monkeypatch.setattr(env, "copy_ceiling_gbps", lambda: {"gbps": 3000.0})
    monkeypatch.setattr(benchmark, "provenance", lambda: {"ops": {"op1": {"run": {"run_id": "r1"}}}})
    out = tmp_path / "b.json"
    seen = {}

    def measure(args):
        seen.update(tables=args.tables, peers=args.peers, cells=args.cells.pattern, ceiling=args.ceiling_gbps)
        args.save([{"cell": "c1", "correct": True}])
        seen["partial"] = json.loads(out.read_text())
        return [{"cell": "c1", "correct": True}, {"cell": "c2", "correct": False}], {"g": 1.1}, "g 1.1"

    rc = benchmark.main(["--out", str(out), "--tables", "fwd", "--peers", "p2", "--cells", "M4096"], "d", "q",
                        measure, ("peer-dist",), ("fwd", "bwd"), ("p1", "p2"))
    assert rc == 1 and "WRONG on 1 cells: c2" in capsys.readouterr().err
    assert seen == {"tables": ["fwd"], "peers": ["p2"], "cells": "M4096", "ceiling": 3000.0,
                    "partial": {**seen["partial"], "complete": False}}
    assert len(seen["partial"]["cells"]) == 1
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["environment"]["peers"] == {"peer-dist": None}
    assert doc["copy_ceiling"] == {"gbps": 3000.0} and doc["runs"] == {"op1": "r1"} and doc["g"] == 1.1
    # merged runs (KDA's decode and prefill in one package) are all named
    monkeypatch.setattr(benchmark, "provenance", lambda: {"ops": {"op1": {"run": {"run_id": "r1"}, "runs": [
        {"run": {"run_id": "r1"}}, {"run": {"run_id": "r2"}}]}}})
    assert benchmark.header((), ceiling=False)["runs"] == {"op1": "r1+r2"}
    with pytest.raises(SystemExit):
        benchmark.parser("d", "q", ("fwd",), ("p1",)).parse_args(["--peers", "p1,nope"])
    assert "unknown nope; known: p1" in capsys.readouterr().err


def test_the_environment_records_the_settings_that_change_how_a_peer_is_built_or_tuned(monkeypatch):
    import sys
    from types import SimpleNamespace

    import evo.export.runtime.package.environment as env

    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(version=SimpleNamespace(cuda="13.0"), __version__="2.x"))
    monkeypatch.setattr(env, "card", lambda: {"name": "Fake H100"})
    monkeypatch.setattr(env, "_driver", lambda: "13.0")
    monkeypatch.setattr(env, "nvrtc_version", lambda: "13.0")
    for k in env.PEER_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("QUACK_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("QUACK_HOME", "/tmp/kf_proof/quack/NVIDIA_H100_80GB_HBM3")
    monkeypatch.setenv("UNRELATED", "x")
    got = env.environment(["quack-kernels"])
    assert got["settings"] == {"QUACK_CACHE_AUTOTUNING": "1", "QUACK_HOME": "/tmp/kf_proof/quack/NVIDIA_H100_80GB_HBM3"}

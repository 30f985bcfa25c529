"""The L2 flush before each timed sample: the worker's mode ($KF_L2_FLUSH, read by default), its place in the
fingerprint class (measurements under the old memset flush keep the classes they were stored with; a read
flush is a class of its own), and the read-flush kernel in the worker's support cubin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evo.loop.record import fingerprint_class
from evo.measure import flush as worker

ROOT = Path(__file__).resolve().parents[2]
FP = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580.159.04", "nvrtc_build": "nvrtc-13.0", "gate": "3"}


def test_the_default_flush_is_by_reads(monkeypatch):
    monkeypatch.delenv("KF_L2_FLUSH", raising=False)
    assert worker.l2_flush_mode() == "read" == worker.DEFAULT_L2_FLUSH


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_named_flush_is_taken(monkeypatch, mode):
    monkeypatch.setenv("KF_L2_FLUSH", mode)
    assert worker.l2_flush_mode() == mode


@pytest.mark.parametrize("bad", ["", "memset", "READ", "none"])
def test_an_unknown_flush_is_refused_by_name(monkeypatch, bad):
    monkeypatch.setenv("KF_L2_FLUSH", bad)
    with pytest.raises(ValueError, match=re.escape(f"KF_L2_FLUSH={bad!r}")):
        worker.l2_flush_mode()


def test_the_memset_flush_keeps_the_classes_stored_before_the_flush_was_recorded():
    old = fingerprint_class(FP)  # a fingerprint recorded before the l2_flush key existed
    assert old == "NVIDIA H200|sm_90|580.159.04|nvrtc-13.0|3"
    assert fingerprint_class(FP | {"l2_flush": "write"}) == old


def test_a_read_flush_is_a_class_of_its_own():
    read = fingerprint_class(FP | {"l2_flush": "read"})
    assert read != fingerprint_class(FP) and read.startswith(fingerprint_class(FP)) and read.endswith("read")


def test_the_worker_records_its_flush_in_the_fingerprint_and_launches_a_kernel_the_cubin_holds():
    src = (ROOT / "evo" / "measure" / "worker.py").read_text()
    assert "self.l2_flush = l2_flush_mode()" in src
    assert '"l2_flush": self.l2_flush' in src
    assert '"kf_read_flush"' in src  # test_support_kernels checks every named kernel is in the cubin
    cu = (ROOT / "evo" / "measure" / "cuda" / "support.cu").read_text()
    assert "kf_read_flush(uint4* p, long long n)" in cu

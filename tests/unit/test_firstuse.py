"""The exported runtime's first-use rules (evo/export/runtime/package/firstuse.py, torch-free): shape classes by
residue, and what a call does before its kernel's outputs are trusted. The probes themselves run in each package's
own tests (ops/*/export/runtime/tests/cpu_tests.py, with torch and a launcher that stands in for the GPU)."""

from __future__ import annotations

import itertools

from evo.export.runtime.package.firstuse import PROBE_TILE, Step, first_use, reduced, selfcheck_on


def test_a_class_keeps_every_residue_a_tile_of_64_or_its_divisors_sees():
    for v in (*range(1, 300), 4096, 32768, 65537, (1 << 31) + 3):
        r = reduced(v)
        assert r == v if v <= PROBE_TILE else PROBE_TILE <= r < 2 * PROBE_TILE
        assert all(r % t == v % t for t in (1, 2, 4, 8, 16, 32, 64))


def test_the_step_before_a_launch():
    for selfcheck, checked, capturing, probe in itertools.product((False, True), repeat=4):
        step = first_use(selfcheck, checked, capturing, probe)
        if not selfcheck or checked:
            assert step is Step.RUN
        elif capturing:
            assert step is Step.TORCH  # nothing can be read back inside graph capture
        else:
            assert step is (Step.PROBE if probe else Step.CHECK_CALL)


def test_the_user_turns_the_check_off_by_the_package_name(monkeypatch):
    monkeypatch.delenv("KF_X_SELFCHECK", raising=False)
    assert selfcheck_on("kf_x")
    monkeypatch.setenv("KF_X_SELFCHECK", "0")
    assert not selfcheck_on("kf_x")
    monkeypatch.setenv("KF_X_SELFCHECK", "1")
    assert selfcheck_on("kf_x")

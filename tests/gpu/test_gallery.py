"""On a GPU: every adversarial kernel gets a status it is allowed, on both timing modes, in one surviving run."""

import pytest

from tests.gpu.gallery_run import CASES, CELLS, CHEATS, run_gallery


@pytest.mark.gpu
def test_gallery_rejects_every_cheat_and_survives():
    outcomes, fingerprint, restarts, ceiling = run_gallery()
    bad = [(o.name, o.cell, o.got, o.allowed, o.error[:120]) for o in outcomes if not o.passed]
    assert not bad, bad
    assert len(outcomes) == len(CASES) * len(CELLS)
    assert len(CHEATS) >= 20
    for o in outcomes:
        if o.name in CHEATS:
            assert o.got != "OK", o
    assert {o.graph for o in outcomes if o.name == "GOOD"} == {True, False}  # both timing modes were met
    assert outcomes[-1].got == "OK" and outcomes[-1].median_us > 0
    assert restarts >= 2  # the hang and the fault each cost one worker
    assert fingerprint["gpu"] and ceiling > 0

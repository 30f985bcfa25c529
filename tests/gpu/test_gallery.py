"""On a GPU: each adversarial kernel is rejected with the right Status, in one surviving run."""

import pytest

from tests.gpu.gallery_run import CASES, run_gallery


@pytest.mark.gpu
def test_gallery_rejects_every_cheat_and_survives():
    outcomes, fingerprint, restarts = run_gallery()
    got = [(o.name, o.got) for o in outcomes]
    assert got == [(n, s.value) for n, s in CASES], got
    assert outcomes[-1].got == "OK" and outcomes[-1].median_us > 0
    assert restarts >= 2  # the hang and the fault each cost one worker
    assert fingerprint["gpu"]

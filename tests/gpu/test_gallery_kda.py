"""On a GPU: every KDA cheat of the gallery is rejected by the evaluator's gate, and the honest kernel passes
before and after them (tests/gpu/gallery_kda.py)."""

import pytest

from tests.gpu.gallery_kda import CASES, run_gallery


@pytest.mark.gpu
def test_the_kda_gallery_rejects_every_cheat():
    outcomes, fingerprint = run_gallery()
    bad = [(o.cheat, o.got, o.allowed, o.error[:160]) for o in outcomes if not o.passed]
    assert not bad, bad
    assert len(outcomes) == len(CASES) and outcomes[0].got == outcomes[-1].got == "OK"
    assert fingerprint.get("gpu")

"""On a GPU: every cheat of the template galleries (KDA's, the RMSNorm backward's) is rejected by the evaluator's
gate, and each honest kernel passes before and after them (tests/gpu/gallery_templates.py)."""

import pytest

from tests.gpu.gallery_templates import GALLERIES, run_gallery


@pytest.mark.gpu
def test_the_template_galleries_reject_every_cheat():
    outcomes, fingerprint = run_gallery()
    bad = [(o.op, o.cheat, o.got, o.allowed, o.error[:160]) for o in outcomes if not o.passed]
    assert not bad, bad
    assert len(outcomes) == sum(len(g.cases) for g in GALLERIES.values())
    for op in GALLERIES:
        mine = [o for o in outcomes if o.op == op]
        assert mine[0].got == mine[-1].got == "OK", op
    assert fingerprint.get("gpu")

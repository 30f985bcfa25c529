"""Every kernel of the adversarial gallery compiles with NVRTC for sm_90a (no GPU needed), and the
gallery names at least 20 cheats, each with statuses that exclude OK."""

import pytest

from evo.core.status import Status
from tests.gpu.gallery_run import CASES, CHEATS, build


@pytest.mark.parametrize("name", sorted({n for n, _, _ in CASES} - {"SUSPECT_BYTES"}))
def test_gallery_kernel_compiles(name):
    cubin = build(name)
    assert cubin[:4] == b"\x7fELF"


def test_gallery_has_twenty_cheats_none_allowed_ok():
    assert len(CHEATS) >= 20
    names = [n for n, _, _ in CASES]
    assert names[0] == names[-1] == "GOOD"
    for name, allowed, what in CASES:
        assert what
        if name in CHEATS:
            assert Status.OK not in allowed

import pytest

from evo.core.genome import Genome


def g(**params):
    return Genome.make("rmsnorm", "warp_row", "abc", params)


def test_key_ignores_param_order():
    assert g(threads=128, vec=8).key() == g(vec=8, threads=128).key()
    assert g(threads=128, vec=8) == g(vec=8, threads=128)
    assert len({g(threads=128, vec=8), g(vec=8, threads=128)}) == 1


@pytest.mark.parametrize("change", [
    dict(params={"threads": 256, "vec": 8}),
    dict(template="cta_row"),
    dict(source_hash="abd"),
    dict(op="other"),
])
def test_key_changes_with_everything_that_changes_code(change):
    base = dict(op="rmsnorm", template="warp_row", source_hash="abc", params={"threads": 128, "vec": 8})
    other = {**base, **change}
    assert Genome.make(**base).key() != Genome.make(**other).key()


def test_value_types_distinguish_keys():
    assert g(flag=True).key() != g(flag=1).key()
    assert g(hint="1").key() != g(hint=1).key()


def test_with_params_returns_new_genome():
    a = g(threads=128)
    b = a.with_params(threads=256)
    assert a.param("threads") == 128 and b.param("threads") == 256
    assert a.key() != b.key()


def test_rejects_non_scalar_params():
    with pytest.raises(TypeError, match="threads"):
        g(threads=[128])

"""RMSNorm forward spec, and the dtype helpers of evo.core.spec it relies on."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from ops.rmsnorm import SPEC
from ops.rmsnorm.spec import cell
from evo.core.spec import DType, round_to_bf16

SHAPES = [(1, 8), (3, 33), (7, 1000)]


def direct_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Row by row with math.fsum, independent of numpy's reductions."""
    out = np.empty(x.shape)
    for i, row in enumerate(x):
        inv = 1.0 / math.sqrt(math.fsum(float(a) * float(a) for a in row) / len(row) + eps)
        out[i] = [float(a) * inv * float(b) for a, b in zip(row, w)]
    return out


@pytest.mark.parametrize("kind", ["normal", "large"])
@pytest.mark.parametrize("m,n", SHAPES, ids=[f"M{m}-N{n}" for m, n in SHAPES])
def test_reference_matches_direct_formula(m: int, n: int, kind: str) -> None:
    c = cell(DType.FP16, m, n)
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(m * n))
    eps = SPEC.scalar_values(c)["eps"]
    got = SPEC.reference(inputs, {"eps": eps})["y"]
    np.testing.assert_allclose(got, direct_rmsnorm(inputs["x"], inputs["w"], eps), rtol=1e-13, atol=0)


def test_eps_is_used() -> None:
    x, w = np.zeros((1, 4)), np.ones(4)
    x[0, 0] = 1e-3
    y = SPEC.reference({"x": x, "w": w}, {"eps": 1e-6})["y"]
    assert y[0, 0] == pytest.approx(1e-3 / math.sqrt(1e-6 / 4 + 1e-6), rel=1e-12)


def test_reference_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(4,\)"):
        SPEC.reference({"x": np.ones((2, 3)), "w": np.ones(4)}, {"eps": 1e-6})


@pytest.mark.parametrize("d", [DType.FP16, DType.BF16])
def test_large_kind_overflows_fp16_squares_but_not_the_reference(d: DType) -> None:
    c = cell(d, 8, 1024)
    inputs = SPEC.make_inputs(c, "large", np.random.default_rng(0))
    x16 = inputs["x"].astype(np.float16)
    with np.errstate(over="ignore"):
        sum_sq = np.sum(x16 * x16, axis=1, dtype=np.float16)
    assert np.isinf(sum_sq).any()
    y = SPEC.reference(inputs, SPEC.scalar_values(c))["y"]
    assert np.all(np.isfinite(y))
    # RMSNorm output has unit RMS before the weight (~1), whatever the input scale.
    assert np.abs(y).max() < 10


def test_edge_cells_catch_tails() -> None:
    cells = SPEC.edge_cells()
    ms = [c.dim("M") for c in cells]
    ns = [c.dim("N") for c in cells]
    assert 1 in ms
    assert any(m % 4 and m % 8 and m > 1 for m in ms)
    assert any(n % 8 for n in ns)
    for d in (DType.BF16, DType.FP16, DType.FP32):
        assert any(c.dtype("x") is d and c.dim("M") == 1 for c in cells), d


def test_bytes_moved_hand_count() -> None:
    # bf16, M=4096, N=1024: x read (8 MiB) + y written (8 MiB) + w read (2 KiB).
    assert SPEC.bytes_moved(cell(DType.BF16, 4096, 1024)) == 8_388_608 + 8_388_608 + 2_048
    # fp16 x with an fp32 weight: the weight is counted at 4 bytes.
    assert SPEC.bytes_moved(cell(DType.FP16, 19, 2056, DType.FP32)) == 2 * 19 * 2056 * 2 + 2056 * 4


def test_matrix_has_36_distinct_cells() -> None:
    cells = SPEC.matrix()
    assert len(cells) == 36
    assert len(set(cells)) == 36
    assert {c.dtype("x") for c in cells} == {DType.BF16, DType.FP16, DType.FP32}


@pytest.mark.parametrize("kind", ["normal", "large"])
def test_inputs_are_representable_in_the_cell_dtype(kind: str) -> None:
    c = cell(DType.BF16, 5, 64)
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(2))
    assert inputs["x"].shape == (5, 64) and inputs["w"].shape == (64,)
    np.testing.assert_array_equal(round_to_bf16(inputs["x"].astype(np.float32)), inputs["x"])
    with pytest.raises(ValueError, match="bogus"):
        SPEC.make_inputs(c, "bogus", np.random.default_rng(2))


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


# Between 1 and 1 + 2^-7 (the bf16 spacing at 1), halfway is 1 + 2^-8.
TIES = [
    (1.0 + 2.0**-8, 1.0),  # tie, 1.0 has an even last bit: round down
    (1.0 + 3 * 2.0**-8, 1.0 + 2.0**-6),  # tie between odd 1 + 2^-7 and even 1 + 2^-6: round up
    (-(1.0 + 2.0**-8), -1.0),
    (-(1.0 + 3 * 2.0**-8), -(1.0 + 2.0**-6)),
    (1.0 + 2.0**-8 + 2.0**-20, 1.0 + 2.0**-7),  # just above the tie: up
    (1.0 + 2.0**-8 - 2.0**-20, 1.0),  # just below the tie: down
]


@pytest.mark.parametrize("value,want", TIES, ids=[f"{v!r}" for v, _ in TIES])
def test_round_to_bf16_ties_to_even(value: float, want: float) -> None:
    got = round_to_bf16(np.array([value], dtype=np.float32))
    assert np.float32(value) == value  # the input itself is exact in float32
    assert got[0] == np.float32(want)


def test_round_to_bf16_is_nearest_and_representable() -> None:
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(20_000) * 10.0 ** rng.uniform(-30, 30, 20_000)).astype(np.float32)
    r = round_to_bf16(a)
    assert r.dtype == np.float32
    assert np.all(_bf16_bits(r) & 0xFFFF == 0)
    np.testing.assert_array_equal(round_to_bf16(r), r)
    # The two bf16 neighbours of each value, by truncating the low 16 bits and stepping one up.
    lo = (_bf16_bits(a) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    hi = ((_bf16_bits(a) & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    err = np.abs(r.astype(np.float64) - a.astype(np.float64))
    assert np.all(err <= np.minimum(np.abs(lo - a), np.abs(hi - a)))


def test_round_to_bf16_keeps_specials() -> None:
    a = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    r = round_to_bf16(a)
    assert np.isnan(r[0]) and r[1] == np.inf and r[2] == -np.inf
    assert _bf16_bits(r[3:]).tolist() == [0, 0x80000000]


@pytest.mark.parametrize("text", ["bf17", "BF16 ", "", "float64"])
def test_dtype_parse_error_names_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"unknown dtype {text!r}")):
        DType.parse(text)


@pytest.mark.parametrize("text,want", [("bf16", DType.BF16), ("bfloat16", DType.BF16), ("half", DType.FP16),
                                       ("float32", DType.FP32), ("int32", DType.INT32)])
def test_dtype_parse_accepts_aliases(text: str, want: DType) -> None:
    assert DType.parse(text) is want

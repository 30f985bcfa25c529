"""The split form of KDA (ops/kda/split.py) against the float64 recurrence: every sequence cut into spans that run
at once, their maps chained in order, the outputs corrected by their span's start state."""

from __future__ import annotations

import numpy as np
import pytest

from ops.kda.reference import kda_fwd
from ops.kda.split import kda_fwd_split, span_bounds, span_maps


def _inputs(rng: np.random.Generator, b: int, t: int, h: int, hv: int, dk: int, dv: int, decay: float,
            n: int | None = None) -> dict[str, np.ndarray]:
    """Unit q and k rows, log decays around `decay` (near 0: decays near 1), beta in (0, 1), a random start state."""
    def rows(shape: tuple[int, ...]) -> np.ndarray:
        r = rng.standard_normal(shape)
        return r / np.linalg.norm(r, axis=-1, keepdims=True)

    out = {"q": rows((b, t, h, dk)), "k": rows((b, t, h, dk)), "v": rng.standard_normal((b, t, hv, dv)),
           "g": decay * np.exp(0.5 * rng.standard_normal((b, t, hv, dk))),
           "beta": rng.uniform(0.05, 0.95, (b, t, hv)),
           "initial_state": rng.standard_normal((n or b, hv, dk, dv)) / np.sqrt(dk)}
    if n is not None:
        out["cu_seqlens"] = np.array([0, *sorted(rng.choice(np.arange(1, t), n - 1, replace=False)), t], np.int32)
    return out


def _rms_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


SCALARS = {"scale": 0.35, "gate": 0, "beta_act": 0, "qk_l2norm": 0, "v_first": 0}


@pytest.mark.parametrize("spans", [1, 2, 5, 37])
@pytest.mark.parametrize("decay", [-1e-3, -0.3, -5.0], ids=["near_one", "mid", "near_zero"])
def test_the_split_form_is_the_recurrence(spans, decay):
    x = _inputs(np.random.default_rng(spans), 2, 37, 2, 4, 8, 6, decay)
    want, got = kda_fwd(x, SCALARS), kda_fwd_split(x, SCALARS, spans)
    for name in ("o", "final_state"):
        assert _rms_rel(got[name], want[name]) < 1e-12, name


def test_pass_one_by_the_chunked_form_and_every_variant_layout_and_varlen():
    """Pass 1 by the chunked (WY) form a kernel uses; the V-first state; sequences of uneven lengths, each split."""
    rng = np.random.default_rng(7)
    x = _inputs(rng, 1, 90, 1, 2, 8, 8, -0.2, n=3)
    s = dict(SCALARS, v_first=1)
    x["initial_state"] = np.swapaxes(x["initial_state"], -1, -2).copy()
    want, got = kda_fwd(x, s), kda_fwd_split(x, s, 4, chunk=16)
    for name in ("o", "final_state"):
        assert _rms_rel(got[name], want[name]) < 1e-12, name


def test_a_spans_maps_are_its_state_from_zero_and_its_transition():
    """[o0 | qt] and [B | A] of one run with K more value columns: B from a zero start, A the map of a start state."""
    rng = np.random.default_rng(3)
    x = _inputs(rng, 1, 11, 1, 1, 4, 3, -0.5)
    q, k, v, a, beta = (x[n][0] for n in ("q", "k", "v", "g", "beta"))
    o0, qt, b, m = span_maps(q, k, v, a, beta, 0.5)
    assert o0.shape == (11, 1, 3) and qt.shape == (11, 1, 4) and b.shape == (1, 4, 3) and m.shape == (1, 4, 4)
    s0 = rng.standard_normal((1, 1, 4, 3))
    whole = kda_fwd({**{n: x[n] for n in ("q", "k", "v", "g", "beta")}, "initial_state": s0},
                    dict(SCALARS, scale=0.5))
    np.testing.assert_allclose(whole["final_state"][0], np.einsum("xkj,xjv->xkv", m, s0[0]) + b, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(whole["o"][0], o0 + np.einsum("txk,xkv->txv", qt, s0[0]), rtol=1e-12, atol=1e-12)


def test_span_bounds_cover_the_sequence_and_refuse_a_bad_count():
    assert span_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert span_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="spans must be in 1..T = 4, got 5"):
        span_bounds(4, 5)


def test_pass_one_in_bf16_keeps_the_outputs_inside_the_ops_tolerance():
    """A kernel's pass 1 returns o0 and the start-state rows in the inputs' dtype (bf16), rounded before the
    correction: the corrected o stays within the op's RMS-relative 0.005 and near what rounding o alone costs."""
    from evo.core.spec import DType, quantize
    from ops.kda.reference import _recur

    rng = np.random.default_rng(0)
    t, x, dk = 512, 2, 32
    q, k = (r / np.linalg.norm(r, axis=-1, keepdims=True) for r in rng.standard_normal((2, t, x, dk)))
    v = rng.standard_normal((t, x, dk))
    a = -np.exp(rng.normal(-2.0, 1.0, (t, x, dk)))
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((t, x))))
    s = rng.standard_normal((x, dk, dk)) / np.sqrt(dk)
    want, _ = _recur(q, k, v, a, beta, s, dk ** -0.5)
    bf = lambda y: quantize(y, DType.BF16)  # noqa: E731
    got = np.empty_like(want)
    for lo, hi in span_bounds(t, 16):
        o0, qt, b, m = span_maps(q[lo:hi], k[lo:hi], v[lo:hi], a[lo:hi], beta[lo:hi], dk ** -0.5)
        got[lo:hi] = bf(bf(o0) + np.einsum("txk,xkv->txv", bf(qt), s))
        s = np.einsum("xkj,xjv->xkv", m, s) + b
    err, alone = _rms_rel(got, want), _rms_rel(bf(want), want)
    assert err < 0.005 and err < 1.5 * alone, (err, alone)

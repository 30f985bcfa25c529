"""KDA with each sequence split into spans that run at once: the form a kernel uses to spread a long sequence of few
heads over the whole card, in float64 (the design the templates follow: docs/kda_split.md).

The recurrence is affine in the state: S_t = M_t S_(t-1) + b_t, with M_t = (I - beta_t k_t k_t^T) diag(exp(a_t)) and
b_t = beta_t k_t v_t^T. So a span [lo, hi) maps its start state S_lo to S_hi = A S_lo + B, and each of its outputs is
o_t = o0_t + qt_t S_lo, where B and o0 are the span's state and outputs from a zero start, A = M_(hi-1) ... M_lo (K x K)
and qt_t = scale q_t^T M_t ... M_lo (a K-row). All four come from one run of the plain recurrence on the span with K
more value columns: start state [0 | I], values [v | 0]. Its outputs are [o0 | qt] and its final state [B | A]. So:

1. every span of every head at once: the recurrence (any form: token by token, chunked) with V + K value columns;
2. per head, the spans' start states in order: S_(span i + 1) = A_i S_(span i) + B_i (the first is the initial state);
3. every span at once: o_t = o0_t + qt_t S_(span start), a (span x K) by (K x V) product.

The final state is the last span's S_hi. Pass 1 does (V + K) / V of the recurrence's work, spread over spans x heads
CTA groups instead of heads alone.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ops.kda.reference import _chunked, _recur, _run, prepare

Form = Callable[..., tuple[np.ndarray, np.ndarray]]


def span_bounds(t: int, spans: int) -> list[tuple[int, int]]:
    """[lo, hi) of `spans` spans of nearly equal length covering t tokens (ValueError when spans is not in 1..t)."""
    if not 1 <= spans <= t:
        raise ValueError(f"kda split: spans must be in 1..T = {t}, got {spans}")
    cuts = [t * i // spans for i in range(spans + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def span_maps(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, beta: np.ndarray, scale: float,
              form: Form = _recur) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pass 1 on one span of X heads (q, k, a [L, X, K], v [L, X, V], beta [L, X]): (o0 [L, X, V], qt [L, X, K],
    B [X, K, V], A [X, K, K]), by `form` with V + K value columns from the start state [0 | I]."""
    n, x, dk = q.shape
    dv = v.shape[2]
    v_aug = np.concatenate([v, np.zeros((n, x, dk))], axis=2)
    s_aug = np.concatenate([np.zeros((x, dk, dv)), np.broadcast_to(np.eye(dk), (x, dk, dk))], axis=2)
    o_aug, end = form(q, k, v_aug, a, beta, s_aug, scale)
    return o_aug[..., :dv], o_aug[..., dv:], end[..., :dv], end[..., dv:]


def _split(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, beta: np.ndarray, s0: np.ndarray,
           scale: float, spans: int, form: Form) -> tuple[np.ndarray, np.ndarray]:
    """The three passes over time for X independent heads (shapes as reference._recur)."""
    bounds = span_bounds(q.shape[0], spans)
    maps = [span_maps(q[lo:hi], k[lo:hi], v[lo:hi], a[lo:hi], beta[lo:hi], scale, form) for lo, hi in bounds]
    starts, s = [], s0
    for _, _, b, m in maps:  # pass 2: the only pass in order, spans x (K x K by K x V) a head
        starts.append(s)
        s = np.einsum("xkj,xjv->xkv", m, s) + b
    o = np.empty(v.shape)
    for (lo, hi), (o0, qt, _, _), start in zip(bounds, maps, starts):
        o[lo:hi] = o0 + np.einsum("txk,xkv->txv", qt, start)
    return o, s


def kda_fwd_split(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int], spans: int,
                  chunk: int | None = None) -> dict[str, np.ndarray]:
    """o and final_state as reference.kda_fwd, each sequence split into `spans` spans (at most its length); pass 1
    token by token, or by the chunked form at `chunk`."""
    def form(*args: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f: Form = _recur if chunk is None else (lambda *a: _chunked(*a, chunk=chunk))
        return _split(*args, spans=min(spans, args[0].shape[0]), form=f)

    return _run(prepare(inputs, scalars), form)

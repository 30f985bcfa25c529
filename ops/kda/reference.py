"""Float64 reference for Kimi Delta Attention forward (fla's `naive_recurrent_kda`).

Per sequence and head, with state S of shape [K, V]:
    S_bar = diag(exp(g_t)) S_{t-1}
    S_t   = S_bar + beta_t k_t (v_t - S_bar^T k_t)^T
    o_t   = S_t^T (scale q_t)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def kda_fwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """o and final_state of the KDA recurrence, computed token by token in float64."""
    q, k, v, g, beta = (np.asarray(inputs[n], dtype=np.float64) for n in ("q", "k", "v", "g", "beta"))
    b, t, h, dk, dv = _check_core(q, k, v, g, beta)
    cu = _check_cu_seqlens(inputs.get("cu_seqlens"), b, t)
    n = b if cu is None else len(cu) - 1
    s0 = inputs.get("initial_state")
    if s0 is None:
        s0 = np.zeros((n, h, dk, dv))
    else:
        s0 = np.asarray(s0, dtype=np.float64)
        _expect_shape("initial_state", s0.shape, (n, h, dk, dv), "(N, H, K, V) from q, v and cu_seqlens")
    scale = scalars.get("scale")
    scale = dk**-0.5 if scale is None else float(scale)

    o = np.empty((b, t, h, dv))
    final = np.empty((n, h, dk, dv))
    if cu is None:
        # Batches of one length: fold (B, H) into one axis of independent heads.
        def heads(a: np.ndarray) -> np.ndarray:
            return np.moveaxis(a, 0, 1).reshape(t, b * h, *a.shape[3:])

        o_seq, s = _recur(heads(q), heads(k), heads(v), heads(g), heads(beta), s0.reshape(b * h, dk, dv), scale)
        o[:] = np.moveaxis(o_seq.reshape(t, b, h, dv), 1, 0)
        final[:] = s.reshape(n, h, dk, dv)
    else:
        for i in range(n):
            lo, hi = int(cu[i]), int(cu[i + 1])
            o_seq, final[i] = _recur(q[0, lo:hi], k[0, lo:hi], v[0, lo:hi], g[0, lo:hi], beta[0, lo:hi], s0[i], scale)
            o[0, lo:hi] = o_seq
    return {"o": o, "final_state": final}


def _recur(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, s0: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence over time for X independent heads: q, k, g [T, X, K], v [T, X, V], beta [T, X]."""
    s = s0.copy()
    o = np.empty(v.shape)
    for i in range(q.shape[0]):
        s *= np.exp(g[i])[:, :, None]
        pred = np.einsum("xk,xkv->xv", k[i], s)
        s += (beta[i][:, None] * k[i])[:, :, None] * (v[i] - pred)[:, None, :]
        o[i] = np.einsum("xk,xkv->xv", scale * q[i], s)
    return o, s


def _check_core(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> tuple[int, ...]:
    if q.ndim != 4:
        raise ValueError(f"kda: q must be (B, T, H, K), got shape {q.shape}")
    b, t, h, dk = q.shape
    _expect_shape("k", k.shape, q.shape, "q's shape (B, T, H, K)")
    _expect_shape("g", g.shape, q.shape, "q's shape (B, T, H, K)")
    if v.ndim != 4 or v.shape[:3] != (b, t, h):
        raise ValueError(f"kda: v has shape {v.shape}, expected (B, T, H, V) = ({b}, {t}, {h}, V) from q {q.shape}")
    _expect_shape("beta", beta.shape, (b, t, h), "(B, T, H) from q")
    return b, t, h, dk, v.shape[3]


def _check_cu_seqlens(cu: np.ndarray | None, b: int, t: int) -> np.ndarray | None:
    if cu is None:
        return None
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"kda: cu_seqlens must have shape (N + 1,) with N >= 1, got shape {cu.shape}")
    if b != 1:
        raise ValueError(f"kda: with cu_seqlens, q must have B = 1, got q shape ({b}, {t}, ...)")
    if not np.array_equal(cu, np.round(cu)) or cu[0] != 0 or cu[-1] != t or np.any(np.diff(cu) < 0):
        raise ValueError(f"kda: cu_seqlens must be integers rising from 0 to T = {t}, got {cu.tolist()}")
    return cu.astype(np.int64)


def _expect_shape(name: str, got: tuple[int, ...], want: tuple[int, ...], what: str) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"kda: {name} has shape {tuple(got)}, expected {tuple(want)} ({what})")

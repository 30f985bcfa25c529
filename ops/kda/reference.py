"""Float64 reference for Kimi Delta Attention forward, on flash-linear-attention's surface.

Semantics follow fla (github.com/fla-org/flash-linear-attention) at commit FLA_COMMIT (main of
2026-08-22, `__version__` 0.5.2): `naive_recurrent_kda` (fla/ops/kda/naive.py), `chunk_kda`
(chunk.py, chunk_fwd.py), `fused_recurrent_kda` (fused_recurrent.py), the gates of gate.py and
`l2norm_fwd` (fla/modules/l2norm.py). This module is written from those semantics, not from their code.

Heads: q, k have H heads, v, g, beta and the states HV (a multiple of H); value head j reads qk head
j // (HV / H), as `repeat_interleave` does. Per sequence and value head, with the state S [K, V]:

    q_t, k_t <- x / sqrt(sum(x^2) + 1e-6)                      (qk_l2norm only)
    a_t = g_t                                                  (gate LOG: g is the log decay)
        = -exp(A_log) * softplus(g_t + dt_bias)                (gate SOFTPLUS)
        = lower_bound * sigmoid(exp(A_log) * (g_t + dt_bias))  (gate LOWER_BOUND; exp(A_log) is 1
                                                                without A_log; dt_bias optional)
    b_t = beta_t | sigmoid(beta_t) | 2 sigmoid(beta_t)         (beta_act NONE | SIGMOID | SIGMOID2)
    S_bar = diag(exp(a_t)) S_{t-1}
    S_t   = S_bar + b_t k_t (v_t - S_bar^T k_t)^T
    o_t   = S_t^T (scale q_t)

A_log is [HV] and dt_bias [HV, K] (fla's flat [HV * K] is accepted too). The states are [N, HV, K, V],
or [N, HV, V, K] with v_first (fla's `state_v_first`). With cu_seqlens, B = 1 and the tokens
cu_seqlens[i]:cu_seqlens[i + 1] form sequence i, each with its own state; fla leaves the final state
of an empty sequence unwritten (fused_recurrent), so here every sequence has at least one token.
fla's softplus returns x itself above 20, a relative difference below 3e-9 from the exact one here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

FLA_COMMIT = "bc3b101dcb713ddc5bd8924b66754eb68b5ccf89"
L2NORM_EPS = 1e-6  # inside the square root, as in fla's l2norm_fwd and fused_recurrent_kda


class Gate(enum.IntEnum):
    """How g becomes the log decay: fla's use_gate_in_kernel, and lower_bound (the safe gate)."""

    LOG = 0
    SOFTPLUS = 1
    LOWER_BOUND = 2


class BetaAct(enum.IntEnum):
    """How beta becomes the write strength: fla's use_beta_sigmoid_in_kernel and allow_neg_eigval."""

    NONE = 0
    SIGMOID = 1
    SIGMOID2 = 2


@dataclass(frozen=True)
class Variant:
    """The switches of fla's KDA that change what is computed; all off is fla's default call."""

    gate: Gate = Gate.LOG
    beta_act: BetaAct = BetaAct.NONE
    qk_l2norm: bool = False
    v_first: bool = False

    @classmethod
    def from_scalars(cls, scalars: Mapping[str, float | int]) -> Variant:
        """The variant the scalars name (absent ones take fla's defaults); a clear error otherwise."""
        return cls(
            gate=_choice(scalars, "gate", Gate),
            beta_act=_choice(scalars, "beta_act", BetaAct),
            qk_l2norm=bool(_choice(scalars, "qk_l2norm", None)),
            v_first=bool(_choice(scalars, "v_first", None)),
        )

    def scalars(self) -> dict[str, int]:
        return {"gate": int(self.gate), "beta_act": int(self.beta_act),
                "qk_l2norm": int(self.qk_l2norm), "v_first": int(self.v_first)}


def _choice(scalars: Mapping[str, float | int], name: str, enum_type: type[enum.IntEnum] | None) -> int:
    value = scalars.get(name, 0)
    allowed = {m.value: m.name for m in enum_type} if enum_type else {0: "off", 1: "on"}
    if value not in allowed:
        names = ", ".join(f"{k} ({v})" for k, v in allowed.items())
        raise ValueError(f"kda: scalar {name} = {value!r}, expected one of {names}")
    return enum_type(int(value)) if enum_type else int(value)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow for any finite x."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, as fla's in-kernel L2 norm."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def log_decay(
    g: np.ndarray, gate: Gate, A_log: np.ndarray | None = None, dt_bias: np.ndarray | None = None,
    lower_bound: float | None = None,
) -> np.ndarray:
    """The per-channel log decay a [..., HV, K] that g gives under `gate`."""
    g = np.asarray(g, dtype=np.float64)
    hv, dk = g.shape[-2:]
    if gate is Gate.LOG:
        for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
            if t is not None:
                raise ValueError(f"kda: {name} is given but gate = LOG (g is the log decay) does not use it")
        return g
    if A_log is not None:
        A_log = np.asarray(A_log, dtype=np.float64)
        _expect_shape("A_log", A_log.shape, (hv,), "(HV,) from g")
    if dt_bias is not None:
        dt_bias = np.asarray(dt_bias, dtype=np.float64)
        if dt_bias.shape == (hv * dk,):
            dt_bias = dt_bias.reshape(hv, dk)
        _expect_shape("dt_bias", dt_bias.shape, (hv, dk), "(HV, K) or (HV * K,) from g")
        g = g + dt_bias
    rate = np.ones((hv, 1)) if A_log is None else np.exp(A_log)[:, None]
    if gate is Gate.SOFTPLUS:
        if A_log is None:
            raise ValueError("kda: A_log is required by gate = SOFTPLUS (-exp(A_log) * softplus(g + dt_bias))")
        return -rate * softplus(g)
    if lower_bound is None or not (math.isfinite(lower_bound) and lower_bound < 0):
        raise ValueError(f"kda: lower_bound must be a finite negative number for gate = LOWER_BOUND, got {lower_bound}")
    return lower_bound * sigmoid(rate * g)


def activate_beta(beta: np.ndarray, act: BetaAct) -> np.ndarray:
    beta = np.asarray(beta, dtype=np.float64)
    if act is BetaAct.NONE:
        return beta
    return sigmoid(beta) * (2.0 if act is BetaAct.SIGMOID2 else 1.0)


@dataclass(frozen=True)
class Prepared:
    """Validated inputs in one canonical form: gates and norms applied, q and k repeated to the HV
    value heads, states K-first, and the (batch row, start, end) of every sequence."""

    q: np.ndarray  # [B, T, HV, K]
    k: np.ndarray  # [B, T, HV, K]
    v: np.ndarray  # [B, T, HV, V]
    a: np.ndarray  # [B, T, HV, K] log decay
    beta: np.ndarray  # [B, T, HV]
    s0: np.ndarray  # [N, HV, K, V]
    seqs: tuple[tuple[int, int, int], ...]
    scale: float
    v_first: bool


def prepare(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> Prepared:
    """Check every tensor and scalar (ValueError naming the first problem) and canonicalize."""
    var = Variant.from_scalars(scalars)
    q, k, v, g, beta = (np.asarray(inputs[n], dtype=np.float64) for n in ("q", "k", "v", "g", "beta"))
    b, t, h, hv, dk, dv = _check_core(q, k, v, g, beta)
    cu = _check_cu_seqlens(inputs.get("cu_seqlens"), b, t)
    seqs = tuple((i, 0, t) for i in range(b)) if cu is None else tuple(
        (0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1))
    state_shape = (len(seqs), hv, dv, dk) if var.v_first else (len(seqs), hv, dk, dv)
    s0 = inputs.get("initial_state")
    if s0 is None:
        s0 = np.zeros((len(seqs), hv, dk, dv))
    else:
        s0 = np.asarray(s0, dtype=np.float64)
        layout = "(N, HV, V, K): v_first" if var.v_first else "(N, HV, K, V)"
        _expect_shape("initial_state", s0.shape, state_shape, f"{layout}, N from q and cu_seqlens")
        s0 = np.swapaxes(s0, -1, -2) if var.v_first else s0
    lb = scalars.get("lower_bound")
    a = log_decay(g, var.gate, inputs.get("A_log"), inputs.get("dt_bias"), None if lb is None else float(lb))
    if var.qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    group = hv // h
    scale = scalars.get("scale")
    return Prepared(
        q=np.repeat(q, group, axis=2), k=np.repeat(k, group, axis=2), v=v, a=a,
        beta=activate_beta(beta, var.beta_act), s0=s0, seqs=seqs,
        scale=dk**-0.5 if scale is None else float(scale), v_first=var.v_first,
    )


def kda_fwd(inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> dict[str, np.ndarray]:
    """o and final_state of the KDA recurrence, computed token by token in float64."""
    return _run(prepare(inputs, scalars), _recur)


def kda_fwd_chunked(
    inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float | int], chunk: int = 64
) -> dict[str, np.ndarray]:
    """The same outputs by the chunked (WY) form fast kernels use: per chunk, one unit lower-triangular
    solve for the state corrections, then matrix products for the outputs and the next state."""
    if chunk < 1:
        raise ValueError(f"kda: chunk must be >= 1, got {chunk}")
    return _run(prepare(inputs, scalars), lambda *a: _chunked(*a, chunk=chunk))


def _run(p: Prepared, form) -> dict[str, np.ndarray]:
    b, t, hv, dv = p.v.shape
    dk = p.q.shape[3]
    o = np.empty((b, t, hv, dv))
    final = np.empty((len(p.seqs), hv, dk, dv))
    if all(lo == 0 and hi == t for _, lo, hi in p.seqs):
        # Sequences of one length: fold (B, HV) into one axis of independent heads.
        def heads(x: np.ndarray) -> np.ndarray:
            return np.moveaxis(x, 0, 1).reshape(t, b * hv, *x.shape[3:])

        o_seq, s = form(heads(p.q), heads(p.k), heads(p.v), heads(p.a), heads(p.beta),
                        p.s0.reshape(b * hv, dk, dv), p.scale)
        o[:] = np.moveaxis(o_seq.reshape(t, b, hv, dv), 1, 0)
        final[:] = s.reshape(b, hv, dk, dv)
    else:
        for i, (row, lo, hi) in enumerate(p.seqs):
            o[row, lo:hi], final[i] = form(p.q[row, lo:hi], p.k[row, lo:hi], p.v[row, lo:hi], p.a[row, lo:hi],
                                           p.beta[row, lo:hi], p.s0[i], p.scale)
    return {"o": o, "final_state": np.swapaxes(final, -1, -2).copy() if p.v_first else final}


def _recur(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, beta: np.ndarray, s0: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence over time for X independent heads: q, k, a [T, X, K], v [T, X, V], beta [T, X]."""
    s = s0.copy()
    o = np.empty(v.shape)
    for i in range(q.shape[0]):
        s *= np.exp(a[i])[:, :, None]
        pred = np.einsum("xk,xkv->xv", k[i], s)
        s += (beta[i][:, None] * k[i])[:, :, None] * (v[i] - pred)[:, None, :]
        o[i] = np.einsum("xk,xkv->xv", scale * q[i], s)
    return o, s


def _chunked(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, beta: np.ndarray, s0: np.ndarray, scale: float,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The chunked form over time for X independent heads (shapes as `_recur`). Every exponent is a
    decay over tokens of one chunk, so <= 0: nothing overflows, however fast the decay."""
    s = s0.copy()
    o = np.empty(v.shape)
    for c0 in range(0, q.shape[0], chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, ac = (np.moveaxis(x[sl], 0, 1) for x in (q, k, v, a))  # [X, C, .]
        bc = beta[sl].T  # [X, C]
        n = bc.shape[1]
        cum = np.cumsum(ac, axis=1)  # decay from the chunk start through token r
        causal = np.tril(np.ones((n, n), dtype=bool))
        # rel[x, r, i, :] = decay from after token i through token r (i <= r), else 0.
        rel = np.exp(np.where(causal[None, :, :, None], cum[:, :, None, :] - cum[:, None, :, :], -np.inf))
        a_kk = np.einsum("xrc,xic,xric->xri", kc, kc, rel) * np.tril(np.ones((n, n)), -1)
        a_qk = np.einsum("xrc,xic,xric->xri", qc, kc, rel)
        lhs = np.eye(n) + bc[:, :, None] * a_kk
        rhs = bc[:, :, None] * (vc - np.einsum("xck,xkv->xcv", kc * np.exp(cum), s))
        delta = np.linalg.solve(lhs, rhs)  # [X, C, V]: what each token writes
        oc = scale * (np.einsum("xck,xkv->xcv", qc * np.exp(cum), s) + a_qk @ delta)
        o[sl] = np.moveaxis(oc, 0, 1)
        s = np.exp(cum[:, -1])[:, :, None] * s + np.einsum("xck,xcv->xkv", kc * np.exp(cum[:, -1:] - cum), delta)
    return o, s


def _check_core(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray
) -> tuple[int, int, int, int, int, int]:
    if q.ndim != 4:
        raise ValueError(f"kda: q must be (B, T, H, K), got shape {q.shape}")
    b, t, h, dk = q.shape
    _expect_shape("k", k.shape, q.shape, "q's shape (B, T, H, K)")
    if v.ndim != 4 or v.shape[:2] != (b, t):
        raise ValueError(f"kda: v has shape {v.shape}, expected (B, T, HV, V) = ({b}, {t}, HV, V) from q {q.shape}")
    hv, dv = v.shape[2:]
    if h == 0 or hv % h != 0:
        raise ValueError(f"kda: v has HV = {hv} value heads, not a multiple of q's H = {h} heads")
    _expect_shape("g", g.shape, (b, t, hv, dk), "(B, T, HV, K) from q and v")
    _expect_shape("beta", beta.shape, (b, t, hv), "(B, T, HV) from q and v")
    return b, t, h, hv, dk, dv


def _check_cu_seqlens(cu: np.ndarray | None, b: int, t: int) -> np.ndarray | None:
    if cu is None:
        return None
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"kda: cu_seqlens must have shape (N + 1,) with N >= 1, got shape {cu.shape}")
    if b != 1:
        raise ValueError(f"kda: cu_seqlens needs q with B = 1 (sequences packed along T), got B = {b}")
    if not np.array_equal(cu, np.round(cu)):
        raise ValueError(f"kda: cu_seqlens must hold integers, got {cu.tolist()}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"kda: cu_seqlens must start at 0, got {cu.tolist()}")
    lengths = np.diff(cu)
    if np.any(lengths <= 0):
        i = int(np.argmax(lengths <= 0))
        raise ValueError(f"kda: cu_seqlens must be strictly increasing (every sequence has a token); "
                         f"sequence {i} has length {int(lengths[i])} in {cu.tolist()}")
    if cu[-1] != t:
        raise ValueError(f"kda: cu_seqlens must end at T = {t} (q's tokens), got {int(cu[-1])}")
    return cu


def _expect_shape(name: str, got: tuple[int, ...], want: tuple[int, ...], what: str) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"kda: {name} has shape {tuple(got)}, expected {tuple(want)} ({what})")

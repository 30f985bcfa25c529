"""The torch path: the KDA recurrence in float32 torch operations (float64 for the checks), every
variant fla's entry points take, correct but not searched.

Per sequence and value head, with the state S [K, V] (fla's fused_recurrent_kda, token by token):
    q, k <- x / sqrt(sum(x^2) + 1e-6)                         (use_qk_l2norm_in_kernel)
    a = g | -exp(A_log) softplus(g + dt_bias) | lower_bound sigmoid(exp(A_log) (g + dt_bias))
    b = beta | sigmoid(beta) | 2 sigmoid(beta)
    S <- diag(exp(a)) S;  S <- S + b k (v - S^T k)^T;  o = S^T (scale q)
Value head j reads qk head j // (HV / H). States are [N, HV, K, V], or [N, HV, V, K] with state_v_first.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

L2NORM_EPS = 1e-6


def check_shapes(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None,
                 cu_seqlens: Tensor | None, v_first: bool) -> int:
    """The number of sequences N; ValueError naming the first tensor of a wrong shape."""
    if q.dim() != 4:
        raise ValueError(f"kda: q must be (B, T, H, K), got shape {tuple(q.shape)}")
    b, t, h, dk = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"kda: k has shape {tuple(k.shape)}, expected q's {tuple(q.shape)}")
    if v.dim() != 4 or tuple(v.shape[:2]) != (b, t):
        raise ValueError(f"kda: v has shape {tuple(v.shape)}, expected (B, T, HV, V) = ({b}, {t}, HV, V)")
    hv, dv = v.shape[2:]
    if h == 0 or hv % h:
        raise ValueError(f"kda: v has HV = {hv} value heads, not a multiple of q's H = {h}")
    if tuple(g.shape) != (b, t, hv, dk):
        raise ValueError(f"kda: g has shape {tuple(g.shape)}, expected (B, T, HV, K) = {(b, t, hv, dk)}")
    if tuple(beta.shape) not in ((b, t, hv), (b, t, hv, dv)):
        raise ValueError(f"kda: beta has shape {tuple(beta.shape)}, expected (B, T, HV) = {(b, t, hv)} "
                         f"(or headwise {(b, t, hv, dv)})")
    n = b
    if cu_seqlens is not None:
        if b != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {b} when using `cu_seqlens`. "
                             "Please flatten variable-length inputs before processing.")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"kda: cu_seqlens must have shape (N + 1,), got {tuple(cu_seqlens.shape)}")
        n = cu_seqlens.numel() - 1
    if initial_state is not None:
        want = (n, hv, dv, dk) if v_first else (n, hv, dk, dv)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"kda: initial_state has shape {tuple(initial_state.shape)}, expected {want} "
                             f"({'(N, HV, V, K): state_v_first' if v_first else '(N, HV, K, V)'})")
    return n


def log_decay(g: Tensor, gate: int, A_log: Tensor | None, dt_bias: Tensor | None, lower_bound: float | None,
              acc: torch.dtype) -> Tensor:
    """The per-channel log decay [B, T, HV, K] that g gives under `gate` (0 log, 1 softplus, 2 lower bound)."""
    g = g.to(acc)
    if gate == 0:
        return g
    hv, dk = g.shape[-2:]
    if dt_bias is not None:
        if dt_bias.numel() != hv * dk:
            raise ValueError(f"kda: dt_bias has {dt_bias.numel()} elements, expected HV * K = {hv * dk}")
        g = g + dt_bias.to(acc).reshape(hv, dk)
    if A_log is not None and A_log.numel() != hv:
        raise ValueError(f"kda: A_log has {A_log.numel()} elements, expected HV = {hv}")
    if gate == 1:
        if A_log is None:
            raise ValueError("kda: use_gate_in_kernel without lower_bound (-exp(A_log) softplus(g + dt_bias)) "
                             "needs A_log")
        return -A_log.to(acc).exp().reshape(hv, 1) * torch.nn.functional.softplus(g)
    rate = 1.0 if A_log is None else A_log.to(acc).exp().reshape(hv, 1)
    return float(lower_bound) * torch.sigmoid(rate * g)


def _recur(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence for X independent heads: q, k, a [X, T, K], v [X, T, V], b [X, T, 1 or V], s [X, K, V]."""
    o = torch.empty_like(v)
    for i in range(q.shape[1]):
        s = s * a[:, i].exp().unsqueeze(-1)
        u = b[:, i] * (v[:, i] - torch.einsum("xk,xkv->xv", k[:, i], s))
        s = s + k[:, i].unsqueeze(-1) * u.unsqueeze(-2)
        o[:, i] = torch.einsum("xk,xkv->xv", q[:, i], s)
    return o, s


def kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, A_log: Tensor | None = None,
        dt_bias: Tensor | None = None, scale: float | None = None, initial_state: Tensor | None = None,
        cu_seqlens: Tensor | None = None, gate: int = 0, beta_act: int = 0, qk_l2norm: bool = False,
        v_first: bool = False, lower_bound: float | None = None,
        acc: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """(o [B, T, HV, V] in `acc`, final state [N, HV, K, V] (V-first: [N, HV, V, K]) in `acc`)."""
    n = check_shapes(q, k, v, g, beta, initial_state, cu_seqlens, v_first)
    b_, t, h, dk = q.shape
    hv, dv = v.shape[2:]
    scale = dk ** -0.5 if scale is None else float(scale)
    qf, kf = q.to(acc), k.to(acc)
    if qk_l2norm:
        qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + L2NORM_EPS)
        kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + L2NORM_EPS)
    qf = (qf * scale).repeat_interleave(hv // h, dim=2)
    kf = kf.repeat_interleave(hv // h, dim=2)
    a = log_decay(g, gate, A_log, dt_bias, lower_bound, acc)
    bf = beta.to(acc)
    if beta_act:
        bf = torch.sigmoid(bf) * (2.0 if beta_act == 2 else 1.0)
    bf = bf.unsqueeze(-1) if bf.dim() == 3 else bf
    vf = v.to(acc)
    if initial_state is None:
        s0 = torch.zeros(n, hv, dk, dv, dtype=acc, device=q.device)
    else:
        s0 = initial_state.to(acc)
        s0 = s0.transpose(-1, -2) if v_first else s0

    def heads(x: Tensor) -> Tensor:  # [B', T', HV, D] -> [B' * HV, T', D]
        return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])

    if cu_seqlens is None:
        o, s = _recur(heads(qf), heads(kf), heads(vf), heads(a), heads(bf), s0.reshape(n * hv, dk, dv))
        o = o.reshape(b_, hv, t, dv).transpose(1, 2)
        final = s.reshape(n, hv, dk, dv)
    else:
        o = torch.empty(b_, t, hv, dv, dtype=acc, device=q.device)
        final = torch.empty(n, hv, dk, dv, dtype=acc, device=q.device)
        bounds = [int(x) for x in cu_seqlens.tolist()]
        if bounds[0] != 0 or bounds[-1] != t or any(hi <= lo for lo, hi in itertools.pairwise(bounds)):
            raise ValueError(f"kda: cu_seqlens must rise strictly from 0 to T = {t}, got {bounds}")
        for i in range(n):
            lo, hi = bounds[i], bounds[i + 1]
            sl = slice(lo, hi)
            oi, si = _recur(heads(qf[:, sl]), heads(kf[:, sl]), heads(vf[:, sl]), heads(a[:, sl]), heads(bf[:, sl]),
                            s0[i])
            o[:, sl] = oi.reshape(1, hv, hi - lo, dv).transpose(1, 2)
            final[i] = si
    final = final.transpose(-1, -2).contiguous() if v_first else final.contiguous()
    return o.contiguous(), final

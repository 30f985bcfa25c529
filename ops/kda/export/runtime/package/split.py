"""KDA with each sequence split into spans that run at once (docs/kda_split.md in Kernel Factory): for long sequences of
few heads, where one call's B x HV heads leave most of the GPU idle.

Pass 1 is two calls of a KDA entry point (`call`: the package's chunk_kda, or any function with fla's signature) on
the sequences cut into `spans` equal spans, seen as a batch of B x spans sequences: the values from a zero state
(each span's outputs and end state from zero), and zero values from the identity (each output's row of the span's
start state and the span's transition). Pass 2 chains the spans' start states in order, pass 3 corrects the outputs
(torch, float32). The result is the call's (o, final state), the same op up to rounding: o0 and the start-state rows
come back in the inputs' dtype before the correction is added.

torch is imported on the first split, so `split_spans` (which cells the split serves) reads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from torch import Tensor

SPLIT_BELOW_HEADS = 32  # cells of fewer sequences x value heads than this ...
SPLIT_FROM_T = 16384  # ... and at least this many tokens a sequence are the split's (the bench times them split too)
SPLIT_SPANS = 16


def split_spans(dims: Mapping[str, int]) -> int:
    """The spans a cell's sequences are cut into (0: none): long sequences of few heads, K == V, no varlen, T a
    multiple of the spans."""
    few_long = dims["B"] * dims["HV"] < SPLIT_BELOW_HEADS and dims["T"] >= SPLIT_FROM_T
    plain = dims["N"] == dims["B"] and dims["K"] == dims["V"] and dims["T"] % SPLIT_SPANS == 0
    return SPLIT_SPANS if few_long and plain else 0


def split_kda(call: Callable[..., tuple[Tensor, Tensor | None]], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
              beta: Tensor, spans: int, *, scale: float | None = None, initial_state: Tensor | None = None,
              output_final_state: bool = False, state_v_first: bool = False, cu_seqlens: Tensor | None = None,
              **kw: Any) -> tuple[Tensor, Tensor | None]:
    """`call`'s (o, final_state) with every sequence cut into `spans` spans (T a multiple of spans, K == V, no
    cu_seqlens: ValueError or NotImplementedError naming the problem); kw passes on to `call` (the variant keywords,
    A_log, dt_bias, lower_bound)."""
    import torch

    if cu_seqlens is not None:
        raise NotImplementedError("split_kda: variable-length batches (cu_seqlens) are not split")
    b, t, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if dk != dv:
        raise ValueError(f"split_kda: the identity start state needs K == V, got K = {dk}, V = {dv}")
    if spans < 1 or t % spans:
        raise ValueError(f"split_kda: T = {t} is not a multiple of spans = {spans}")
    n, span = b * spans, t // spans

    def cut(x: Tensor) -> Tensor:
        return x.reshape(n, span, *x.shape[2:])

    def k_first(s: Tensor) -> Tensor:
        return s.transpose(-1, -2) if state_v_first else s

    qs, ks, vs, gs, bs = (cut(x) for x in (q, k, v, g, beta))
    dev = q.device
    zero = torch.zeros(n, hv, dk, dv, dtype=torch.float32, device=dev)
    eye = torch.eye(dk, dtype=torch.float32, device=dev).expand(n, hv, dk, dk).contiguous()
    common = dict(kw, scale=scale, output_final_state=True, state_v_first=state_v_first)
    o0, end0 = call(qs, ks, vs, gs, bs, initial_state=zero, **common)
    qt, end1 = call(qs, ks, torch.zeros_like(vs), gs, bs, initial_state=eye, **common)
    ends = k_first(end0).float().reshape(b, spans, hv, dk, dv)
    maps = k_first(end1).float().reshape(b, spans, hv, dk, dk)
    s = (k_first(initial_state).float() if initial_state is not None
         else torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=dev))
    starts = []
    for i in range(spans):  # pass 2, the only pass in order: spans (K x K by K x V) products a head
        starts.append(s)
        s = maps[:, i] @ s + ends[:, i]
    start = torch.stack(starts, dim=1)  # [B, spans, HV, K, V]
    o = o0.float().reshape(b, spans, span, hv, dv) + torch.einsum(
        "bslhk,bshkv->bslhv", qt.float().reshape(b, spans, span, hv, dk), start)
    final = (s.transpose(-1, -2).contiguous() if state_v_first else s) if output_final_state else None
    return o.reshape(b, t, hv, dv).to(v.dtype), final

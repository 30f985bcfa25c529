"""The peers the package's benchmark times beside its KDA calls, each a zero-argument callable returning
(o, final_state) for the cell's tensors, or a one-line reason why it is absent: fla's chunk_kda (its default path,
and its tensor-core path for bounded gates, safe_gate=True), fla's FlashKDA backend, fla's fused_recurrent_kda
(decode cells), cuDNN frontend's KDA and cuLA. Imported lazily: a missing peer never stops the benchmark.

`outputs(name, result, like)` brings a peer's answer to the package's layout (cuDNN's token-major o and V-first
state) for the check; nothing is converted inside the timed call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .sides import side

NAMES = ("fla.chunk_kda", "fla.chunk_kda.safe_gate", "fla.flash_kda", "fla.fused_recurrent_kda", "cudnn", "cula")
DISTS = ("fla-core", "flash-linear-attention", "flash-kda", "nvidia-cudnn-frontend", "cuda-linear-attention")
LOWER_BOUND = -5.0  # the safe gate's bound (fla's recommended value; the op's lower-bound gate uses it)


def sides(dims: Mapping[str, int], t: Mapping[str, Tensor], kw: Mapping[str, Any], names: tuple[str, ...]
          ) -> dict[str, Callable[[], Any] | str]:
    decode = dims["T"] == 1
    gate = dims["gate"]

    def chunk(safe: bool):
        from fla.ops.kda import chunk_kda

        if decode:
            raise NotImplementedError("a decode cell (T = 1): fla's decode kernel is fused_recurrent_kda")
        if gate == 2 and not safe:
            raise NotImplementedError("the lower-bound gate is fla's safe_gate path (timed as fla.chunk_kda.safe_gate)")
        if gate == 1 and safe:
            raise NotImplementedError("safe_gate replaces this cell's softplus gate by lower_bound * sigmoid(...)")
        fkw = dict(kw) | {"safe_gate": safe}
        if safe and gate:
            fkw["lower_bound"] = LOWER_BOUND
        return lambda: chunk_kda(**t, **fkw)

    def flash_kda():
        import flash_kda  # noqa: F401  (fla hands chunk_kda to it in inference mode when it is installed)
        from fla.ops.kda import chunk_kda

        if not (gate == 2 and dims["qk_l2norm"] and dims["beta_act"] == 1 and dims["v_first"]
                and dims["HV"] == dims["H"] and not decode):
            raise NotImplementedError("FlashKDA takes only the safe gate with q/k L2 norm, beta sigmoid and a "
                                      "V-first state in kernel, HV = H: not this cell's call")

        def run():
            with torch.inference_mode():
                return chunk_kda(**t, **(dict(kw) | {"safe_gate": True, "lower_bound": LOWER_BOUND}))
        return run

    def fused():
        from fla.ops.kda import fused_recurrent_kda

        if not decode:
            raise NotImplementedError("a decode kernel: timed on T = 1 cells only")
        return lambda: fused_recurrent_kda(**t, **kw)

    def cudnn():
        from cudnn.linear_attention.ops.kda import kimi_delta_attention

        if gate == 1:
            raise NotImplementedError("cuDNN's KDA takes log decays or the safe gate, not this cell's softplus gate")
        b, tt = t["q"].shape[:2]
        thd = {n: t[n].reshape(b * tt, *t[n].shape[2:]) for n in ("q", "k", "v", "g", "beta")}
        cu = kw.get("cu_seqlens")
        cu = (torch.arange(0, (b + 1) * tt, tt, device="cuda") if cu is None else cu).to(torch.int32)
        h0 = kw["initial_state"]
        h0 = h0 if dims["v_first"] else h0.transpose(-1, -2).contiguous()
        ckw: dict[str, Any] = {"initial_state": h0, "output_final_state": True,
                               "use_qk_l2norm_in_kernel": bool(dims["qk_l2norm"]),
                               "use_beta_sigmoid_in_kernel": dims["beta_act"] != 0,
                               "allow_neg_eigval": dims["beta_act"] == 2}
        if gate == 2:
            ckw |= {"safe_gate": True, "gate_lower_bound": LOWER_BOUND, "a_log": kw["A_log"],
                    "dt_bias": kw["dt_bias"].reshape(dims["HV"], dims["K"])}
        return lambda: kimi_delta_attention(**thd, cu_seqlens=cu, **ckw)[:2]

    def cula():
        import cula  # noqa: F401

        raise NotImplementedError("cuLA is installed but its KDA call is not wired into this benchmark")

    makers = {"fla.chunk_kda": lambda: chunk(False), "fla.chunk_kda.safe_gate": lambda: chunk(True),
              "fla.flash_kda": flash_kda, "fla.fused_recurrent_kda": fused, "cudnn": cudnn, "cula": cula}
    return {n: side(makers[n]) for n in names}


def outputs(name: str, result: Any, v: Tensor, v_first: bool) -> tuple[Tensor, Tensor]:
    """(o, final_state) in the package's layout: o like v, the state as the cell keeps it."""
    o, final = result[0], result[1]
    if name == "cudnn":
        o = o.reshape(v.shape[0], v.shape[1], *o.shape[1:])
        final = final if v_first else final.transpose(-1, -2)
    return o, final

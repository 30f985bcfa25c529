"""fla's KDA entry points: fused_recurrent_kda (decode) and chunk_kda (prefill), with fla's signatures
and return convention (o in v's dtype, the final state in float32 or None), forward only.

Each call takes the path `explain(...)` names: a searched kernel, or the float32 torch path for what
the kernels do not compute; chunk_kda raises MissingKernel when the export holds no prefill kernel.
Keywords fla takes that change what is computed and that the package does not implement raise
NotImplementedError naming them; those fla itself ignores are ignored.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from .choose import variant_dims
from .run import runtime

# fla keywords that select a backend, an optimization or a backward detail, not the forward result
_IGNORED = frozenset({"chunk_size", "disable_recompute", "cu_seqlens_cpu", "safe_gate"})


def _state_v_first(state_v_first: bool, kwargs: dict[str, Any]) -> bool:
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=3)
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    return state_v_first


def _refuse(entry: str, kwargs: dict[str, Any]) -> None:
    unknown = sorted(k for k, v in kwargs.items() if k not in _IGNORED and v is not None and v is not False)
    if unknown:
        raise NotImplementedError(f"{entry}: keyword(s) {', '.join(unknown)} are not implemented by this package "
                                  "(fla's forward keywords are)")


def _call(entry: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Tensor | None,
          dt_bias: Tensor | None, scale: float | None, initial_state: Tensor | None, output_final_state: bool,
          cu_seqlens: Tensor | None, lower_bound: float | None, *, use_gate_in_kernel: bool,
          **flags: bool) -> tuple[Tensor, Tensor | None]:
    """One call of `entry` with fla's keywords (`flags`: the other variant keywords of variant_dims); A_log,
    dt_bias and lower_bound count only with the gate computed in the kernel."""
    variant = variant_dims(use_gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound, **flags)
    t = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log if use_gate_in_kernel else None,
         "dt_bias": dt_bias if use_gate_in_kernel else None, "initial_state": initial_state, "cu_seqlens": cu_seqlens}
    o, final = runtime().call(entry, t, scale, lower_bound if use_gate_in_kernel else None, variant)
    return o, (final if output_final_state else None)


def fused_recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Tensor | None = None,
                        dt_bias: Tensor | None = None, scale: float | None = None,
                        initial_state: Tensor | None = None, output_final_state: bool = False,
                        use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                        use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                        lower_bound: float | None = None, state_v_first: bool = False,
                        cu_seqlens: torch.LongTensor | None = None, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """KDA by the recurrent form, as fla's fused_recurrent_kda: (o [B, T, HV, V], final_state
    [N, HV, K, V] fp32 (V-first: [N, HV, V, K]) if output_final_state else None). Out of place."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    _refuse("fused_recurrent_kda", kwargs)
    if cu_seqlens is not None and initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(f"The number of initial states is expected to be equal to the number of input sequences, "
                         f"i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")
    return _call("fused_recurrent_kda", q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                 cu_seqlens, lower_bound, use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first)


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float | None = None,
              initial_state: Tensor | None = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: float | None = None, disable_recompute: bool = False,
              return_intermediate_states: bool = False, state_v_first: bool = False,
              cu_seqlens: torch.LongTensor | None = None, cu_seqlens_cpu: torch.LongTensor | None = None,
              cp_context: Any = None, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """KDA by the chunked form, as fla's chunk_kda (A_log and dt_bias as keywords): (o, final_state fp32
    or None). Runs the exported prefill kernels; MissingKernel when the export has none."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    if return_intermediate_states:
        raise NotImplementedError("chunk_kda: return_intermediate_states is not implemented by this package")
    if cp_context is not None:
        raise NotImplementedError("chunk_kda: cp_context (context parallelism) is not implemented by this package")
    if safe_gate and use_gate_in_kernel and lower_bound is None:
        raise ValueError("chunk_kda: safe_gate=True needs lower_bound")
    _refuse("chunk_kda", kwargs)
    return _call("chunk_kda", q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, cu_seqlens,
                 lower_bound, use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first)


def stats() -> dict[str, dict[str, int]]:
    """Calls per entry point and path in this process ({'fused_recurrent_kda': {'table': 3, 'torch': 1}})."""
    return runtime().stats()

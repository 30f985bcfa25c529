"""KDA's hooks for the GPU worker: the float64 device reference of o and final_state, and fla's kernels
as peers with their real signatures (fla/ops/kda at reference.FLA_COMMIT).

Standard library only, so the worker stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
KMAX = 256  # the reference's local state column (fla's kernels take K <= 256 too)
THREADS = 64  # KDA_REF_THREADS in device.cu
TENSORS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "ref:o", "ref:final_state")


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """One launch, a CTA per (64 value columns, value head, sequence); every optional tensor the plan
    leaves out reaches it as a null pointer (initial_state zeros, final_state unwritten, no varlen)."""
    k, v, n = dims["K"], dims["V"], dims["N"]
    if k > KMAX:
        raise ValueError(f"kda device reference: K = {k} > {KMAX}")
    if n > 65535:
        raise ValueError(f"kda device reference: N = {n} sequences > 65535 (grid z)")
    kernel = f"kda_ref_{SHORT[dtypes['x']]}_{SHORT[dtypes['g']]}_{SHORT[dtypes['state']]}"
    args = tuple(("buf", t) for t in TENSORS) + tuple(("i32", dims[d]) for d in ("T", "H", "HV", "K", "V"))
    args += (("f64", float(scalars["scale"])), ("f64", float(scalars["lower_bound"])))
    args += tuple(("i32", int(scalars[s])) for s in ("gate", "beta_act", "qk_l2norm", "v_first"))
    return [(kernel, ((v + THREADS - 1) // THREADS, dims["HV"], n), (THREADS, 1, 1), args)]


def tail_width(dims: Mapping[str, int]) -> int:
    """Columns at the end of a row counted as 'tail' in wrong-answer patterns (the last value columns)."""
    return min(16, dims["V"])


def fla_kwargs(t: Mapping[str, Any], s: Mapping[str, float]) -> dict[str, Any]:
    """The keyword arguments both fla entry points take for the cell's variant (scalars mirror it):
    optional tensors as bound (absent ones None), dt_bias flat [HV * K] as fla indexes it, cu_seqlens
    as the int64 fla declares (converted in the call: a small copy, timed with the peer)."""
    gate, beta_act = int(s["gate"]), int(s["beta_act"])
    cu = t.get("cu_seqlens")
    kw = {
        "scale": float(s["scale"]),
        "initial_state": t.get("initial_state"),
        "output_final_state": True,
        "use_qk_l2norm_in_kernel": bool(s["qk_l2norm"]),
        "use_gate_in_kernel": gate != 0,
        "use_beta_sigmoid_in_kernel": beta_act != 0,
        "allow_neg_eigval": beta_act == 2,
        "lower_bound": float(s["lower_bound"]) if gate == 2 else None,
        "state_v_first": bool(s["v_first"]),
        "cu_seqlens": None if cu is None else cu.long(),
    }
    if gate != 0:
        dt_bias = t.get("dt_bias")
        kw |= {"A_log": t.get("A_log"), "dt_bias": None if dt_bias is None else dt_bias.reshape(-1)}
    return kw


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """name -> fn(tensors, scalars) returning (o, final_state), or why the peer is absent. fla's
    fused_recurrent_kda (decode; out of place: a new fp32 final state) and chunk_kda (prefill; it
    asserts an fp32 initial state, so a bf16-state cell finds it absent with fla's own words)."""
    from ops.baselines import absent_unless

    def fused() -> Callable:
        from fla.ops.kda import fused_recurrent_kda

        return lambda t, s: fused_recurrent_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], **fla_kwargs(t, s))

    def chunk() -> Callable:
        from fla.ops.kda import chunk_kda

        def run(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            kw = fla_kwargs(t, s)
            kw["safe_gate"] = int(s["gate"]) == 2  # the lower-bound gate is fla's safe gate in chunk_kda
            return chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)

        return run

    makers = {"fla.fused_recurrent_kda": fused, "fla.chunk_kda": chunk}
    return {n: absent_unless(makers, n) for n in (names or ("fla.fused_recurrent_kda",))}


def peer_outputs(name: str, result: Any) -> dict[str, Any]:
    """A peer's return value by output: fla's kernels return (o, final_state), final_state None when
    not asked for (not checked then)."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else type(result).__name__
        raise ValueError(f"kda peer {name!r} returned {got}; expected (o, final_state)")
    o, state = result
    return {"o": o} if state is None else {"o": o, "final_state": state}

"""RMSNorm's hooks for the GPU worker: the float64 device reference and the torch baseline.

Standard library only, so the worker stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


VARIANT_DIMS = ("bias", "store_rstd")  # ops/rmsnorm/spec.py's (repeated: the worker stays light)
# (x, w, residual) dtypes the variant reference is instantiated for (device.cu)
VARIANT_KERNELS = {(x, w, r) for x in ("f16", "bf16") for w in (x, "f32") for r in (x, "f32")} | {("f32", "f32", "f32")}


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """Launches (kernel, grid, block, args) that write float64 references into 'ref:<output>'.

    A cell of the plain op (or with only an out dtype) gets today's kernel; a cell with a variant (a
    "residual" dtype role, dims bias, store_rstd) the variant kernel, which is told the cell's variant
    and writes NaN (so fails) for a candidate whose launch plan binds other tensors than it has."""
    m, n = dims["M"], dims["N"]
    flags = int("residual" in dtypes) + sum(bit for bit, d in zip((2, 4), VARIANT_DIMS) if dims.get(d, 0))
    if not flags:
        kernel = f"rmsnorm_ref_{SHORT[dtypes['x']]}_{SHORT[dtypes['w']]}"
        args = (("buf", "x"), ("buf", "w"), ("buf", "ref:y"), ("i32", m), ("i32", n), ("f64", float(scalars["eps"])))
        return [(kernel, (m, 1, 1), (256, 1, 1), args)]
    x, w = SHORT[dtypes["x"]], SHORT[dtypes["w"]]
    r = SHORT[dtypes.get("residual", dtypes["x"])]
    if (x, w, r) not in VARIANT_KERNELS:
        raise ValueError(f"rmsnorm device reference: no variant kernel for x={x}, w={w}, residual={r}")
    args = (("buf", "x"), ("buf", "residual"), ("buf", "w"), ("buf", "bias"), ("buf", "ref:y"),
            ("buf", "ref:residual_out"), ("buf", "ref:rstd"), ("i32", m), ("i32", n),
            ("f64", float(scalars["eps"])), ("i32", flags))
    return [(f"rmsnorm_ref_variant_{x}_{w}_{r}", (m, 1, 1), (256, 1, 1), args)]


def tail_width(dims: Mapping[str, int]) -> int:
    """Columns at the end of a row counted as 'tail' in wrong-answer patterns."""
    return min(16, dims["N"])


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """name -> fn(tensors, scalars) for each peer asked for (default: torch eager), or why it is absent."""
    from ops.baselines import absent_unless, compiled

    # Peers see the candidate's inputs only: a residual (prenorm: they return residual_out too) and a
    # bias are honoured; y comes in x's dtype and no rstd is stored (out_dtype and store_rstd are not
    # in what a baseline is given).
    def eager(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        x, w, n = t["x"], t["w"], t["x"].shape[-1]
        if "residual" not in t and "bias" not in t:
            return torch.nn.functional.rms_norm(x, (n,), w, s["eps"])
        h = x.float() + t["residual"].float() if "residual" in t else x
        y = torch.nn.functional.rms_norm(h.float(), (n,), w.float(), s["eps"])
        y = (y + t["bias"].float() if "bias" in t else y).to(x.dtype)
        return (y, h.to(t["residual"].dtype)) if "residual" in t else y

    def liger() -> Callable:
        from liger_kernel.ops.rms_norm import rms_norm_forward  # the kernel behind LigerRMSNormFunction

        def fwd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            if "residual" in t or "bias" in t:
                raise NotImplementedError("liger's rms_norm_forward takes no residual or bias")
            # (X, W, eps, offset, casting_mode, row_mode) -> (Y, X, RSTD, BLOCK_SIZE, num_warps, casting_mode)
            return rms_norm_forward(t["x"], t["w"], s["eps"], 0.0, "llama", None)[0]

        return fwd

    def quack(tuned: bool) -> Callable:
        import importlib

        # the module, not the function: quack/__init__.py binds the name quack.rmsnorm to a function
        q = importlib.import_module("quack.rmsnorm")

        if not tuned:  # the analytical heuristic's config: rmsnorm_fwd -> (out, residual_out, rstd)
            def fwd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
                out, res_out, _ = q.rmsnorm_fwd(t["x"], t["w"], bias=t.get("bias"), residual=t.get("residual"),
                                                eps=s["eps"])
                return (out, res_out) if "residual" in t else out

            return fwd

        def tuned_fwd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            # @autotune benches every config on the first call per (shape, dtype) key and keeps the best
            out = torch.empty_like(t["x"])
            res = t.get("residual")
            res_out = torch.empty_like(res) if res is not None else None
            q.rmsnorm_fwd_tuned(t["x"], t["w"], out, bias=t.get("bias"), residual=res, residual_out=res_out,
                                eps=s["eps"])
            return (out, res_out) if res is not None else out

        return tuned_fwd

    makers = {"torch.rms_norm": lambda: eager, "torch.compile": lambda: compiled(torch, eager),
              "liger": liger, "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True)}
    return {n: absent_unless(makers, n) for n in (names or ("torch.rms_norm",))}


def peer_outputs(name: str, result: Any) -> dict[str, Any]:
    """A peer's return value by output: y alone, or (y, residual_out) where the cell has a residual
    (baselines() returns these; no peer stores rstd)."""
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise ValueError(f"rmsnorm peer {name!r} returned a {len(result)}-tuple; expected y or (y, residual_out)")
        return {"y": result[0], "residual_out": result[1]}
    return {"y": result}

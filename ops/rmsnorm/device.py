"""RMSNorm's hooks for the GPU worker: the float64 device reference and the torch baseline.

Standard library only, so the worker stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """Launches (kernel, grid, block, args) that write float64 references into 'ref:<output>'."""
    m, n = dims["M"], dims["N"]
    kernel = f"rmsnorm_ref_{SHORT[dtypes['x']]}_{SHORT[dtypes['w']]}"
    args = (("buf", "x"), ("buf", "w"), ("buf", "ref:y"), ("i32", m), ("i32", n), ("f64", float(scalars["eps"])))
    return [(kernel, (m, 1, 1), (256, 1, 1), args)]


def tail_width(dims: Mapping[str, int]) -> int:
    """Columns at the end of a row counted as 'tail' in wrong-answer patterns."""
    return min(16, dims["N"])


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """name -> fn(tensors, scalars) for each peer asked for (default: torch eager), or why it is absent."""
    from ops.baselines import absent_unless, compiled

    def eager(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        return torch.nn.functional.rms_norm(t["x"], (t["x"].shape[-1],), t["w"], s["eps"])

    def liger() -> Callable:
        from liger_kernel.ops.rms_norm import rms_norm_forward  # the kernel behind LigerRMSNormFunction

        # (X, W, eps, offset, casting_mode, row_mode) -> (Y, X, RSTD, BLOCK_SIZE, num_warps, casting_mode)
        return lambda t, s: rms_norm_forward(t["x"], t["w"], s["eps"], 0.0, "llama", None)[0]

    def quack(tuned: bool) -> Callable:
        import importlib

        # the module, not the function: quack/__init__.py binds the name quack.rmsnorm to a function
        q = importlib.import_module("quack.rmsnorm")

        if not tuned:  # the analytical heuristic's config: rmsnorm_fwd -> (out, residual_out, rstd)
            return lambda t, s: q.rmsnorm_fwd(t["x"], t["w"], eps=s["eps"])[0]

        def tuned_fwd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            # @autotune benches every config on the first call per (shape, dtype) key and keeps the best
            out = torch.empty_like(t["x"])
            q.rmsnorm_fwd_tuned(t["x"], t["w"], out, eps=s["eps"])
            return out

        return tuned_fwd

    makers = {"torch.rms_norm": lambda: eager, "torch.compile": lambda: compiled(torch, eager),
              "liger": liger, "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True)}
    return {n: absent_unless(makers, n) for n in (names or ("torch.rms_norm",))}

"""RMSNorm backward's hooks for the GPU worker: float64 device references of dx and dw, the torch baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# dw's reference comes with an element-wise error scale ('scale:dw'): the rms of the column's terms, at least 1.
# A sum's rounding grows with its terms, not its value: where the gate's perturbed "large" set puts terms of
# ~400 in a column whose sum may cancel, a correct fp32 sum over 32768 rows misses the unit-term atol
# (1e-5 sqrt(M)) by 1.1-1.6x (nine such rejections in an H100 fp32 run, rel. norm err 4e-7).
# dx's too ('scale:dx'): max(1, |x| |rstd|^3 sum|dout w x| / N), the bound of its term a x, which carries the
# rounding of the row's dot product (an ulp of a ~4600 term on the perturbed "normal" set) into every element,
# and of rstd dout w wherever the two cancel: there a right fp32 dx misses atol + rtol |dx| by up to 1.9x
# (two such rejections of cluster kernels on H100 fp32 runs, 3.8e-5).
SCALED = ("dw", "dx")


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """dx one CTA per row, dw one thread per column summing over the rows (float64), each with its error scale."""
    m, n = dims["M"], dims["N"]
    sfx = f"{SHORT[dtypes['x']]}_{SHORT[dtypes['w']]}"
    bufs = (("buf", "x"), ("buf", "w"), ("buf", "dout"), ("buf", "rstd"))
    return [(f"rmsnorm_bwd_dx_ref_{sfx}", (m, 1, 1), (256, 1, 1),
             bufs + (("buf", "ref:dx"), ("buf", "scale:dx"), ("i32", m), ("i32", n))),
            (f"rmsnorm_bwd_dw_ref_{sfx}", ((n + 127) // 128, 1, 1), (128, 1, 1),
             bufs + (("buf", "ref:dw"), ("buf", "scale:dw"), ("i32", m), ("i32", n)))]


def error_scales(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The numpy mirror of the reference's 'scale:dw' and 'scale:dx' (tests/gpu/test_op_device_reference.py checks
    the device's)."""
    import numpy as np

    x, dy = np.asarray(inputs["x"], np.float64), np.asarray(inputs["dout"], np.float64)
    w = np.asarray(inputs["w"], np.float64)
    r = np.asarray(inputs["rstd"], np.float64).reshape(-1, 1)
    t = dy * x * r
    dot_abs = np.mean(np.abs(dy * w * x), axis=1, keepdims=True)  # sum |dout w x| / N
    return {"dw": np.maximum(1.0, np.sqrt(np.mean(t * t, axis=0))),
            "dx": np.maximum(1.0, np.abs(x) * np.abs(r) ** 3 * dot_abs)}


def tail_width(dims: Mapping[str, int]) -> int:
    return min(16, dims["N"])


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """name -> fn(tensors, scalars) returning (dx, dw), or why the peer is absent. torch.eager is the
    backward in torch ops (fp32, reading rstd as given, as the op and every other peer does); torch's
    autograd recomputes the forward's statistics from x (rstd is not read), so on the gate's inputs,
    whose rstd is drawn apart from x, its answer is another op's: the peer check reports it absent."""
    from ops.baselines import absent_unless

    def eager(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        x, w, dout = t["x"].float(), t["w"].float(), t["dout"].float()
        rstd = t["rstd"].float().unsqueeze(-1)
        xhat = x * rstd
        g = dout * w
        dx = rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
        return dx.to(t["x"].dtype), (dout * xhat).sum(dim=0).to(t["w"].dtype)

    def autograd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        x = t["x"].detach().requires_grad_(True)
        w = t["w"].detach().requires_grad_(True)
        y = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
        return torch.autograd.grad(y, (x, w), t["dout"])

    def liger() -> Callable:
        from liger_kernel.ops.rms_norm import rms_norm_backward
        from liger_kernel.ops.utils import calculate_settings

        def run(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            block, warps = calculate_settings(t["x"].shape[-1])  # raises past Triton's largest block
            # (dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode) -> (dX, dW);
            # in_place=False: dout is an input of every other peer and of the candidate
            return rms_norm_backward(t["dout"], t["x"], t["w"], t["rstd"], 0.0, "llama", block, warps, False, None)

        return run

    def quack(tuned: bool) -> Callable:
        import importlib

        # the module, not the function: quack/__init__.py binds the name quack.rmsnorm to a function
        q = importlib.import_module("quack.rmsnorm")

        if not tuned:  # rmsnorm_bwd -> (dx, dw, db, dresidual); dw from fp32 partials summed by torch
            return lambda t, s: q.rmsnorm_bwd(t["x"], t["w"], t["dout"], t["rstd"])[:2]
        from quack.rmsnorm_config import get_sm_count

        def tuned_bwd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
            x, w = t["x"], t["w"]
            sm = get_sm_count(x.shape[-1], x.device)
            dx = torch.empty_like(x)
            part = torch.empty((sm, x.shape[-1]), device=x.device, dtype=torch.float32)
            q.rmsnorm_bwd_tuned(x, w, t["dout"], t["rstd"], dx, part, sm_count=sm, has_dw_partial=True)
            return dx, part.sum(dim=0).to(w.dtype)

        return tuned_bwd

    makers = {"torch.eager": lambda: eager, "torch.autograd(rms_norm)": lambda: autograd, "liger": liger,
              "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True)}
    return {n: absent_unless(makers, n) for n in (names or ("torch.eager",))}


def peer_outputs(name: str, result: Any) -> dict[str, Any]:
    """A peer's return value by output: every peer in baselines() returns (dx, dw)."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else type(result).__name__
        raise ValueError(f"rmsnorm_bwd peer {name!r} returned {got}; expected (dx, dw)")
    return {"dx": result[0], "dw": result[1]}

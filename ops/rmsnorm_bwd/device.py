"""RMSNorm backward's hooks for the GPU worker: float64 device references of dx and dw, the torch baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

SOURCE = Path(__file__).with_name("device.cu")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def reference(dims: Mapping[str, int], dtypes: Mapping[str, str], scalars: Mapping[str, float]) -> list[tuple]:
    """dx one CTA per row; dw one thread per column summing over the rows (both in float64)."""
    m, n = dims["M"], dims["N"]
    sfx = f"{SHORT[dtypes['x']]}_{SHORT[dtypes['w']]}"
    bufs = (("buf", "x"), ("buf", "w"), ("buf", "dout"), ("buf", "rstd"))
    return [(f"rmsnorm_bwd_dx_ref_{sfx}", (m, 1, 1), (256, 1, 1), bufs + (("buf", "ref:dx"), ("i32", m), ("i32", n))),
            (f"rmsnorm_bwd_dw_ref_{sfx}", ((n + 127) // 128, 1, 1), (128, 1, 1),
             bufs + (("buf", "ref:dw"), ("i32", m), ("i32", n)))]


def tail_width(dims: Mapping[str, int]) -> int:
    return min(16, dims["N"])


def baselines(torch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """torch's autograd of rms_norm (it recomputes the forward's statistics from x; rstd is not read)."""
    from ops.baselines import absent_unless

    def autograd(t: Mapping[str, Any], s: Mapping[str, float]) -> Any:
        x = t["x"].detach().requires_grad_(True)
        w = t["w"].detach().requires_grad_(True)
        y = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
        return torch.autograd.grad(y, (x, w), t["dout"])

    makers = {"torch.autograd(rms_norm)": lambda: autograd}
    return {n: absent_unless(makers, n) for n in (names or ("torch.autograd(rms_norm)",))}

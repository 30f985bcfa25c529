"""One call of the op: choose the path, launch the kernel (checked on its first use in each shape class: a probe
of the class's M on random rows, firstuse.py), or fall back to torch, and count which path ran (`stats()`).

A kernel that fails to compile or fails its first-use check is not used again in this process; a
warning says why, once, and its calls take the torch path. A kernel is not used inside CUDA graph capture
before its class has been checked (the check reads results back).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import lru_cache

import torch
from torch import Tensor

from . import reference, verify
from .choose import Choice, choose, probe_dims, variant_call
from .expr import dtype_name
from .guard import Guarded, aligned, probe_generator, tensor_arch

EPS_RANGE = (1e-6, 1e-4)  # a probe's eps, drawn (log-uniform): a kernel that folds eps to a constant is caught


def variant_tensors(x: Tensor, w: Tensor, y: Tensor, residual: Tensor | None, residual_out: Tensor | None,
                    bias: Tensor | None, rstd: Tensor | None) -> dict[str, Tensor]:
    """A variant launch's tensors by name: x, w, y and those of the variants the call has."""
    opt = (("residual", residual), ("residual_out", residual_out), ("bias", bias), ("rstd", rstd))
    return {"x": x, "w": w, "y": y} | {k: v for k, v in opt if v is not None}


class Runtime(Guarded):
    """RMSNorm's calls (forward, backward) on the shared launch guard; paths counted by op."""

    NOUN = "shape"

    def choice(self, op: str, x: Tensor, weight: Tensor) -> Choice:
        m, n = x.shape
        dims = (("M", m), ("N", n))
        try:
            dtypes = (("w", dtype_name(weight.dtype)), ("x", dtype_name(x.dtype)))
        except ValueError as e:  # float64, say: no kernel reads it
            return Choice(op, "torch", dims, (), 0, str(e))
        if not x.is_cuda:
            return Choice(op, "torch", dims, dtypes, 0, "a CPU tensor")
        return choose(op, dims, dtypes, tensor_arch(x.device))

    def variant_choice(self, x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None,
                       store_rstd: bool) -> Choice:
        """The forward's path for a (M, N) call with these variants (the cell the factory keys it by)."""
        try:
            dt, wdt = dtype_name(x.dtype), dtype_name(weight.dtype)
            rdt = dtype_name(residual.dtype) if residual is not None else ""
        except ValueError as e:
            return Choice("rmsnorm", "torch", tuple(sorted(dict(M=x.shape[0], N=x.shape[1]).items())), (), 0, str(e))
        dims, dtypes = variant_call(x.shape, dt, wdt, residual=rdt, bias=bias is not None, store_rstd=store_rstd)
        if not x.is_cuda:
            return Choice("rmsnorm", "torch", dims, dtypes, 0, "a CPU tensor")
        return choose("rmsnorm", dims, dtypes, tensor_arch(x.device))

    def probe_dims(self, c: Choice) -> tuple[tuple[str, int], ...]:
        return probe_dims(c)

    def probe(self, c: Choice, device: torch.device) -> str:
        """The kernel on random rows at the probe shape (x and dout normal, the weight near 1, a drawn eps), every
        output checked against float64 (all rows)."""
        d, dt = dict(c.dims), {k: getattr(torch, v) for k, v in c.dtypes}
        m, n = d["M"], d["N"]
        g = probe_generator(device)

        def normal(*shape: int, dtype: torch.dtype, mean: float = 0.0) -> Tensor:
            return (mean + torch.randn(*shape, generator=g, device=device)).to(dtype)

        x, w = normal(m, n, dtype=dt["x"]), normal(n, dtype=dt["w"], mean=1.0)
        if c.op == "rmsnorm_bwd":
            dout = normal(m, n, dtype=dt["x"])
            r = torch.rsqrt(x.float().square().mean(dim=-1) + 1e-6)
            dx, dw = torch.empty_like(x), torch.empty_like(w)
            self.launcher.run(c, {"x": x, "w": w, "dout": dout, "rstd": r, "dx": dx, "dw": dw}, {})
            return verify.check_backward(x, w, dout, r, dx, dw, sample=m)
        eps = EPS_RANGE[0] * (EPS_RANGE[1] / EPS_RANGE[0]) ** random.SystemRandom().random()
        y = torch.empty_like(x)
        residual = normal(m, n, dtype=dt["residual"]) if "residual" in dt else None
        bias = normal(n, dtype=dt["w"]) if d.get("bias") else None
        if residual is None and bias is None and not d.get("store_rstd"):
            self.launcher.run(c, {"x": x, "w": w, "y": y}, {"eps": eps})
            return verify.check_forward(x, w, eps, y, sample=m)
        res_out = torch.empty_like(residual) if residual is not None else None
        r = torch.empty(m, dtype=torch.float32, device=device) if d.get("store_rstd") else None
        self.launcher.run(c, variant_tensors(x, w, y, residual, res_out, bias, r), {"eps": eps})
        return verify.check_variant(x, w, residual, bias, eps, y, res_out, r, sample=m)

    def _count(self, c: Choice, path: str) -> None:
        self.count(c.op, path)

    def launch(self, c: Choice, tensors: Mapping[str, Tensor], scalars: Mapping[str, float],
               check: Callable[[], str]) -> bool:
        """Run the choice's kernel; False when the caller must take the torch path instead."""
        return self.run_kernel(c, c.op, tensors, scalars, check)

    def forward(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm of a (M, N) tensor with a (N,) weight, output in x's dtype."""
        if x.shape[0] == 0 or x.shape[1] == 0:
            return reference.forward_2d(x, weight, eps)
        c = self.choice("rmsnorm", x, weight)
        if c.kernel:
            x, weight = aligned(x), aligned(weight)
            y = torch.empty_like(x)
            if self.launch(c, {"x": x, "w": weight, "y": y}, {"eps": eps},
                           lambda: verify.check_forward(x, weight, eps, y)):
                return y
        else:
            self._count(c, "torch")
        return reference.forward_2d(x, weight, eps)

    def forward_variant(self, x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
                        store_rstd: bool, choice: Choice | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(y, residual_out, rstd) of a (M, N) call with a residual (h = x + residual, residual_out = h in
        the residual's dtype), a bias (N,) in the weight's dtype and/or rstd (M,) float32 stored: the
        variant kernel, bound as the factory's gate binds it (the template's "name?" args: the tensors
        of the call's variant, null pointers for the others), else float32 torch. `choice`: the call's
        variant_choice where the caller made it already."""
        m, n = x.shape
        c = (choice or self.variant_choice(x, weight, residual, bias, store_rstd)) if m and n else None
        if c is not None and c.kernel:
            x, weight = aligned(x), aligned(weight)
            residual = aligned(residual) if residual is not None else None
            bias = aligned(bias) if bias is not None else None
            y = torch.empty_like(x)
            res_out = torch.empty_like(residual) if residual is not None else None
            r = torch.empty(m, dtype=torch.float32, device=x.device) if store_rstd else None
            if self.launch(c, variant_tensors(x, weight, y, residual, res_out, bias, r), {"eps": eps},
                           lambda: verify.check_variant(x, weight, residual, bias, eps, y, res_out, r)):
                return y, res_out, r
        elif c is not None:
            self._count(c, "torch")
        y, res_out, r = reference.rmsnorm_fwd(x, weight, bias, residual, None, None, eps, store_rstd)
        return y, (res_out if residual is not None else None), (r.float() if store_rstd else None)

    def backward(self, x: Tensor, weight: Tensor, dout: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        """dx (M, N) in x's dtype and dw (N,) in the weight's dtype, from the rstd the forward used."""
        if x.shape[0] == 0 or x.shape[1] == 0:
            return reference.backward_2d(x, weight, dout, r)
        c = self.choice("rmsnorm_bwd", x, weight)
        if c.kernel and dout.dtype == x.dtype:  # the kernels read dout as x's dtype
            x, weight, dout, r = aligned(x), aligned(weight), aligned(dout), aligned(r.float())
            dx, dw = torch.empty_like(x), torch.empty_like(weight)
            if self.launch(c, {"x": x, "w": weight, "dout": dout, "rstd": r, "dx": dx, "dw": dw}, {},
                           lambda: verify.check_backward(x, weight, dout, r, dx, dw)):
                return dx, dw
        else:
            self._count(c, "torch")
        return reference.backward_2d(x, weight, dout, r)


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    return Runtime()

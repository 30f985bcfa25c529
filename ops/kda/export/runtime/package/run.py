"""One call of an entry point: choose the path, launch the kernel (checked on its first use in each shape class:
a probe at a few sequences of the class's length on random inputs, firstuse.py), or run the torch path, and count
which path ran (`stats()`).

The kernels take contiguous q, k, v, g, beta and an fp32 initial state [N, HV, SR, SC]; a call without
one binds zeros, and the final state is always written (dropped when not asked for). A kernel that
fails to compile or its first-use check is not used again in this process; a warning says why, once,
and its calls take the torch path. A kernel is not used inside CUDA graph capture before its class has been
checked (the check reads results back).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from . import reference, verify
from .choose import (
    ENTRY_POINTS,
    OP,
    STATE_DTYPE,
    VARIANT_DIMS,
    Choice,
    MissingKernel,
    _torch,
    call_dims,
    choose,
    probe_dims,
    templates_of,
    unsupported,
)
from .expr import dtype_name
from .guard import Guarded, aligned, probe_generator, tensor_arch
from .loader import PACKAGE
from .table import tables


MEMO_SIZE = 4096  # remembered call paths (cleared when full)
_SHAPED = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens")


def memo_key(entry: str, t: Mapping[str, Tensor | None], variant: Mapping[str, int]) -> tuple | None:
    """What a call's shape check and path depend on (entry point, every shape, the dtypes, the device, the
    variant), or None for a call the memo does not take: a CPU tensor, tensors on several devices, or a tensor
    that needs grad while grad is on (such calls are checked in full every time)."""
    q = t["q"]
    dev = q.get_device()  # -1: not a CUDA tensor
    if dev < 0:
        return None
    grad = torch.is_grad_enabled()
    for x in t.values():
        if x is not None and ((grad and x.requires_grad) or (x.dim() > 0 and x.get_device() != dev)):
            return None
    shapes = tuple(None if t.get(n) is None else t[n].shape for n in _SHAPED)
    dtypes = (q.dtype, t["k"].dtype, t["v"].dtype, t["g"].dtype, t["beta"].dtype)
    return entry, dev, shapes, dtypes, tuple(variant.items())


class Runtime(Guarded):
    """KDA's entry points on the shared launch guard; paths counted by entry point."""

    STACKLEVEL = 5  # the warning names the caller of the api function (one frame more than RMSNorm's)

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[tuple, Choice] = {}

    def probe_dims(self, c: Choice) -> tuple[tuple[str, int], ...]:
        return probe_dims(c)

    def probe(self, c: Choice, device: torch.device) -> str:
        """The kernel at the probe shape on random inputs: q, k unit rows (raw where the kernel normalizes them),
        v normal, a log decay in [-5, 0) (a raw gate with A_log and dt_bias where the kernel applies it), beta in
        (0, 1) (logits where the kernel applies the sigmoid), a random initial state, a drawn scale and lower bound,
        a varlen batch's lengths drawn; o and the final state checked against float64 on every sequence."""
        d, dt = dict(c.dims), dict(c.dtypes)
        b, t, h, hv, dk, dv, n = (d[k] for k in ("B", "T", "H", "HV", "K", "V", "N"))
        xdt, gdt = getattr(torch, dt["x"]), getattr(torch, dt["g"])
        gen, rng = probe_generator(device), random.SystemRandom()

        def normal(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=gen, device=device)

        q, k = normal(b, t, h, dk), normal(b, t, h, dk)
        if not d["qk_l2norm"]:
            q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
        tensors: dict[str, Tensor] = {"q": q.to(xdt), "k": k.to(xdt), "v": normal(b, t, hv, dv).to(xdt)}
        if d["gate"]:
            tensors["g"] = normal(b, t, hv, dk).to(gdt)
            tensors["A_log"] = torch.empty(hv, device=device).uniform_(0.0, 2.7, generator=gen)
            tensors["dt_bias"] = 0.1 * normal(hv * dk)
        else:
            tensors["g"] = torch.nn.functional.logsigmoid(normal(b, t, hv, dk)).clamp(min=-5.0).to(gdt)
        logits = normal(b, t, hv)
        tensors["beta"] = (logits if d["beta_act"] else torch.sigmoid(logits)).to(xdt)
        tensors["initial_state"] = 0.1 * normal(n, hv, d["SR"], d["SC"])
        if n != b:
            cuts = sorted(rng.sample(range(1, t), n - 1))
            tensors["cu_seqlens"] = torch.tensor([0, *cuts, t], dtype=torch.int32, device=device)
        scalars: dict[str, Any] = {"scale": dk ** -0.5 * rng.uniform(0.5, 2.0), "lower_bound": rng.uniform(-5.0, -1.0),
                                   **{v: d[v] for v in VARIANT_DIMS}}
        o = torch.empty_like(tensors["v"])
        final = torch.empty(n, hv, d["SR"], d["SC"], dtype=torch.float32, device=device)
        self.launcher.run(c, tensors | {"o": o, "final_state": final}, scalars)
        return verify.check(tensors, scalars, o, final)

    def choice(self, entry: str, t: Mapping[str, Tensor | None], variant: Mapping[str, int]) -> Choice:
        """The path of a call with tensors `t` (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens), its
        shapes checked first (reference.check_shapes: a ValueError names a wrong one). A call whose tensors are
        all on one CUDA device and need no grad is remembered by what its shape check and path depend on
        (memo_key): a decode step repeats one call, and its host time is most of it."""
        key = memo_key(entry, t, variant)
        c = None if key is None else self._memo.get(key)
        if c is None:
            reference.check_shapes(t["q"], t["k"], t["v"], t["g"], t["beta"], t.get("initial_state"),
                                   t.get("cu_seqlens"), bool(variant["v_first"]))
            c = self._choice(entry, t, variant)
            if key is not None:
                with self._lock:
                    if len(self._memo) >= MEMO_SIZE:
                        self._memo.clear()
                    self._memo[key] = c
        return c

    def _choice(self, entry: str, t: Mapping[str, Tensor | None], variant: Mapping[str, int]) -> Choice:
        q, v, cu = t["q"], t["v"], t.get("cu_seqlens")
        dims = call_dims(q.shape, v.shape, None if cu is None else cu.numel() - 1, variant)
        try:
            dt = {"x": dtype_name(q.dtype), "g": dtype_name(t["g"].dtype), "state": STATE_DTYPE}
        except ValueError as e:  # float64, say: no kernel reads it
            return self._generic(entry, dims, {}, 0, str(e))
        others = {n: t[n].dtype for n in ("k", "v", "beta") if t[n].dtype != q.dtype}
        if others:
            return self._generic(entry, dims, dt, 0, f"{', '.join(others)} not in q's dtype {q.dtype}: the kernels "
                                 "read q, k, v, beta in one dtype")
        arch = tensor_arch(q.device) if q.is_cuda else 0
        if t["beta"].dim() == 4:
            return self._generic(entry, dims, dt, arch, "headwise beta (B, T, HV, V): the kernels read beta (B, T, HV)")
        devices = {x.device for x in t.values() if x is not None and x.dim() > 0}
        if not q.is_cuda or len(devices) > 1:
            return self._generic(entry, dims, dt, arch, "a CPU tensor" if not q.is_cuda else "tensors on several devices")
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in t.values()):
            return self._generic(entry, dims, dt, arch, "inputs require grad: the kernels are forward only")
        problem = unsupported(dims)
        if problem:
            return self._generic(entry, dims, dt, arch, problem)
        return choose(entry, tuple(sorted(dims.items())), tuple(sorted(dt.items())), arch)

    @staticmethod
    def _generic(entry: str, dims: Mapping[str, int], dt: Mapping[str, str], arch: int, why: str) -> Choice:
        """The torch path, unless the entry point has no kernel of its kind at all ("missing" wins)."""
        if not templates_of(tables().get(OP), entry) and ENTRY_POINTS[entry][0] == "prefill":
            return choose(entry, tuple(sorted(dims.items())), tuple(sorted(dt.items())), arch)
        return _torch(entry, dims, dt, arch, why)

    def launch(self, c: Choice, tensors: Mapping[str, Tensor], scalars: Mapping[str, float], o: Tensor,
               final: Tensor) -> bool:
        """Run the choice's kernel; False when the caller must take the torch path instead."""
        return self.run_kernel(c, c.entry, tensors, scalars, lambda: verify.check(tensors, scalars, o, final))

    def call(self, entry: str, t: Mapping[str, Tensor | None], scale: float | None, lower_bound: float | None,
             variant: Mapping[str, int]) -> tuple[Tensor, Tensor]:
        """(o in v's dtype, the fp32 final state) of one call."""
        q, v = t["q"], t["v"]
        c = self.choice(entry, t, variant)
        if c.path == "missing":
            raise MissingKernel(f"{PACKAGE}.{entry}: {c}")
        scalars: dict[str, Any] = {"scale": q.shape[-1] ** -0.5 if scale is None else float(scale),
                                   "lower_bound": -5.0 if lower_bound is None else float(lower_bound), **variant}
        if c.kernel:
            dims = dict(c.dims)
            bound = {n: aligned(x) for n, x in t.items() if x is not None}
            h0 = t.get("initial_state")
            shape = (dims["N"], dims["HV"], dims["SR"], dims["SC"])
            if h0 is None:
                bound["initial_state"] = torch.zeros(shape, dtype=torch.float32, device=q.device)
            elif h0.dtype != torch.float32:
                bound["initial_state"] = aligned(h0.to(torch.float32))
            cu = bound.get("cu_seqlens")
            if cu is not None and cu.dtype != torch.int32:
                bound["cu_seqlens"] = cu.to(torch.int32).contiguous()
            o = torch.empty_like(bound["v"])
            final = torch.empty(shape, dtype=torch.float32, device=q.device)
            bound |= {"o": o, "final_state": final}
            if self.launch(c, bound, scalars, o, final):
                return o, final
        else:
            self.count(entry, "torch")
        o, final = reference.kda(q, t["k"], v, t["g"], t["beta"], A_log=t.get("A_log"), dt_bias=t.get("dt_bias"),
                                 scale=scalars["scale"], initial_state=t.get("initial_state"),
                                 cu_seqlens=t.get("cu_seqlens"), gate=variant["gate"], beta_act=variant["beta_act"],
                                 qk_l2norm=bool(variant["qk_l2norm"]), v_first=bool(variant["v_first"]),
                                 lower_bound=lower_bound, acc=torch.float32)
        return o.to(v.dtype), final


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    return Runtime()


__all__ = ["OP", "Runtime", "runtime"]

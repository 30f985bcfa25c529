"""A KDA call's floor, the least time any kernel could take on this card: its bytes (every input read once, o and the
final state written once) at the copy ceiling measured in the same process, or its arithmetic at the card's dense
bf16 tensor-core rate, whichever is longer. The arithmetic is the recurrent form's (7 K V + 2 K + 2 V a token and
value head: decay, S^T k, the rank-1 update, S^T q and the element-wise terms), the least any form does; a chunked
kernel does more, on the tensor cores. A cell's share of its floor is the floor over the package's kernel time.

Standard library only (no relative import): the package's bench reads it, and so do tests without torch.
"""

from __future__ import annotations

from typing import Any, Mapping

# Dense bf16 tensor-core rates from NVIDIA's datasheets (half the rates quoted with sparsity), by a part of the name
# torch.cuda.get_device_name() gives; the first match counts. A card not named here has no arithmetic floor.
DENSE_BF16_TFLOPS = (("H200", 989.5), ("H100 80GB HBM3", 989.5), ("H100 SXM", 989.5), ("H100 PCIe", 756.5))


def dense_bf16_tflops(card: str) -> float | None:
    """The card's dense bf16 rate in TFLOP/s, None where DENSE_BF16_TFLOPS does not name it."""
    return next((rate for part, rate in DENSE_BF16_TFLOPS if part in card), None)


def flops(dims: Mapping[str, int]) -> int:
    """The recurrent form's arithmetic over the call (B, T, HV, K, V of the cell's dims)."""
    b, t, hv, k, v = (int(dims[d]) for d in ("B", "T", "HV", "K", "V"))
    return b * t * hv * (7 * k * v + 2 * k + 2 * v)


def floor(nbytes: int, n_flops: int, ceiling_gbps: float | None, tflops: float | None,
          kernel_us: float | None) -> dict[str, Any]:
    """The floor's parts in microseconds (bytes_us, flops_us: None where the ceiling or the rate is unknown), the
    floor (their maximum), what bounds it ("bytes" or "flops"), and the share of it the kernel time reaches."""
    bytes_us = nbytes / (ceiling_gbps * 1e3) if ceiling_gbps else None
    flops_us = n_flops / (tflops * 1e6) if tflops else None
    parts = {k: v for k, v in (("bytes", bytes_us), ("flops", flops_us)) if v is not None}
    bound = max(parts, key=parts.__getitem__) if parts else None
    floor_us = parts[bound] if bound else None
    share = floor_us / kernel_us if floor_us is not None and kernel_us else None
    return {"bytes_us": bytes_us, "flops": n_flops, "flops_us": flops_us, "tflops": tflops, "floor_us": floor_us,
            "bound": bound, "share": share}

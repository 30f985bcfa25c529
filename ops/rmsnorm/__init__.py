"""RMSNorm forward: y = x * rsqrt(mean(x^2) + eps) * w over the last dim, with its variants (residual
add with residual_out, bias, out dtype, stored rstd) as optional tensors: the registered spec is
spec.VARIANT_SPEC, which on a plain cell is spec.SPEC exactly (same tensors bound, fills, checks)."""

from ops.rmsnorm.spec import VARIANT_SPEC as SPEC

__all__ = ["SPEC"]

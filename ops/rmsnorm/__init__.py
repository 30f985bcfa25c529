"""RMSNorm forward: y = x * rsqrt(mean(x^2) + eps) * w over the last dim."""

from ops.rmsnorm.spec import SPEC

__all__ = ["SPEC"]

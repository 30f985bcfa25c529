"""RMSNorm backward: dx and dw from x, w, dout and the forward's rstd (spec and references; templates to come)."""

from ops.rmsnorm_bwd.spec import SPEC

__all__ = ["SPEC"]

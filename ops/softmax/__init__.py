"""Row-wise softmax: the second op, added through ops/softmax/, templates/softmax/ and experiments/ only."""

from ops.softmax.spec import SPEC

__all__ = ["SPEC"]

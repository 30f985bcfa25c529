"""Kimi Delta Attention forward: a gated delta-rule recurrence with per-channel decay (fla's KDA)."""

from ops.kda.spec import SPEC

__all__ = ["SPEC"]

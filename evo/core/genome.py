"""The genome: a template (by content hash) plus parameter values. A small frozen value."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Genome:
    """One candidate kernel family member, independent of dtype and shape.

    `source_hash` is the sha256 of the template text, so editing a template (or an LLM rewrite)
    gives new keys. `text` carries an LLM-written template's text; it is left out of equality since
    `source_hash` already pins it.
    """

    op: str
    template: str
    source_hash: str
    params: tuple[tuple[str, Any], ...]
    text: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def make(cls, op: str, template: str, source_hash: str, params: Mapping[str, Any], text: str | None = None) -> "Genome":
        for k, v in params.items():
            if not isinstance(v, (int, float, str, bool)):
                raise TypeError(f"param {k}={v!r} must be an int, float, str or bool")
        return cls(op, template, source_hash, tuple(sorted(params.items())), text)

    def param(self, name: str) -> Any:
        return dict(self.params)[name]

    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def with_params(self, **changes: Any) -> "Genome":
        p = self.params_dict()
        p.update(changes)
        return Genome.make(self.op, self.template, self.source_hash, p, self.text)

    def params_json(self) -> str:
        return json.dumps(self.params_dict(), sort_keys=True)

    def key(self) -> str:
        """sha256 over everything that changes the compiled code (dtype/arch/consts are added per build)."""
        payload = json.dumps([self.op, self.template, self.source_hash, self.params_dict()], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def short(self) -> str:
        """Readable label, e.g. 'warp_row(threads=256,vec=8)'."""
        return f"{self.template}(" + ",".join(f"{k}={v}" for k, v in self.params) + ")"

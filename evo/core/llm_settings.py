"""What an LLM client needs: the client half of the experiment's [llm] section, defined once.

`evo.core.config.LLMSection` extends it with what the search loop needs (proposals per generation, lessons
in prompts, replay); `evo.llm.client` takes it as is. Kept apart from `evo.llm` so that reading a config
imports no client code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

OFF = "none"  # the model string that turns the LLM operator off


@dataclass(frozen=True)
class LLMSettings:
    """budget_usd is a hard cap (0: no paid calls; unpriced models cost $0); budget_tokens is a hard cap
    on prompt + completion tokens (0: no token cap). tries bounds attempts per call; a retry waits
    backoff_s * 2**attempt. Invalid values raise ValueError naming the key.
    """

    model: str = OFF
    api_base: str = ""
    budget_usd: float = 0.0
    budget_tokens: int = 0
    timeout_s: float = 120.0
    tries: int = 3
    backoff_s: float = 2.0
    max_concurrency: int = 4
    max_tokens: int = 8192
    temperature: float = 0.7

    def __post_init__(self) -> None:
        if self.budget_usd < 0 or self.budget_tokens < 0:
            raise ValueError("llm.budget_usd / llm.budget_tokens: must be >= 0")
        if self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError("llm.timeout_s must be > 0 and llm.backoff_s >= 0")
        for k in ("tries", "max_concurrency", "max_tokens"):
            if getattr(self, k) < 1:
                raise ValueError(f"llm.{k}: must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.model != OFF

    @classmethod
    def of(cls, section: Any) -> "LLMSettings":
        """The client settings of a config section (an object with some of these fields as attributes)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(section, n) for n in names if hasattr(section, n)})

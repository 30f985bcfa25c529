"""Failure memory: rules from the store's failure lessons that reject a candidate before it costs GPU time."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from evo.search.lessons import MIN_USEFULNESS, applicable
from memory.queries import FAILURE, same_value
from memory.store import Store


@dataclass(frozen=True)
class FailureRule:
    """template + condition (param values) -> predicted status, from a failure lesson."""

    lesson_id: str
    template: str
    condition: tuple[tuple[str, Any], ...]
    predicts: str
    precision: float
    support: int

    def matches(self, template: str, params: Mapping[str, Any]) -> bool:
        return template == self.template and all(k in params and same_value(params[k], v) for k, v in self.condition)


@dataclass(frozen=True)
class FailurePredictor:
    """Call with (template, params): (lesson_id, predicted status) of the strongest matching rule, or None."""

    rules: tuple[FailureRule, ...]

    def __call__(self, template: str, params: Mapping[str, Any]) -> tuple[str, str] | None:
        for rule in self.rules:
            if rule.matches(template, params):
                return rule.lesson_id, rule.predicts
        return None


def failure_predictor(
    store: Store,
    op: str,
    arch: str,
    min_precision: float = 0.9,
    min_support: int = 5,
    min_usefulness: float = MIN_USEFULNESS,
) -> Callable[[str, Mapping[str, Any]], tuple[str, str] | None]:
    """A predictor from the failure lessons of op on arch whose precision and support reach the thresholds."""
    rules = []
    for r in applicable(store, op, arch, FAILURE, min_usefulness).itertuples(index=False):
        s = json.loads(r.structured_json)
        # LLM-written failure lessons carry a Jinja expression as condition; only param=value rules apply here.
        if not isinstance(s.get("condition"), dict) or "precision" not in s:
            continue
        if s["precision"] >= min_precision and s["support"] >= min_support:
            rules.append(
                FailureRule(
                    r.lesson_id,
                    s["template"],
                    tuple(sorted(s["condition"].items())),
                    s["predicts"],
                    float(s["precision"]),
                    int(s["support"]),
                )
            )
    rules.sort(key=lambda x: (-x.precision, -x.support, len(x.condition), x.lesson_id))
    return FailurePredictor(tuple(rules))

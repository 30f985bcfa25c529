"""Replay recorded LLM calls: answers by prompt hash from the llm_calls table, no network.

The k-th request with a given prompt hash gets the k-th recorded answer to it (in recording order),
so a recorded run, repeated prompts included, re-runs identically: same call ids, same answers, and
recorded failures (a timeout, a refused budget) fail again the same way. A prompt with no recorded
answer left is an LLM_ERROR, never an invented answer.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from evo.llm.client import LLMReply
from evo.llm.prompts import Prompt
from evo.core.status import Status
from memory.rows import LLMCallRow


@dataclass(frozen=True)
class _Recorded:
    call_id: str
    response: str | None
    error: str


def _records(calls: Iterable[LLMCallRow] | pd.DataFrame) -> list[dict[str, Any]]:
    if isinstance(calls, pd.DataFrame):
        df = calls
        if "created_at" in df.columns and df["created_at"].notna().all():
            df = df.sort_values("created_at", kind="stable")
        return df.to_dict("records")
    return [vars(c) if isinstance(c, LLMCallRow) else dict(c) for c in calls]


def _text(value: Any) -> str | None:
    """A text cell; pandas gives NaN/None for NULL."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


class ReplayLLM:
    """A client answering from recorded calls (rows, or a DataFrame of the llm_calls table)."""

    enabled = True

    def __init__(self, calls: Iterable[LLMCallRow] | pd.DataFrame) -> None:
        self._answers: dict[str, list[_Recorded]] = {}
        for r in _records(calls):
            self._answers.setdefault(r["prompt_hash"], []).append(
                _Recorded(str(r["call_id"]), _text(r.get("response")), _text(r.get("error")) or "")
            )
        self._used: Counter[str] = Counter()
        self._lock = threading.Lock()

    def complete(self, prompt: Prompt) -> LLMReply:
        """The recorded answer to this prompt (the next unused one), or LLM_ERROR 'no recorded answer'."""
        h = prompt.hash
        with self._lock:
            k = self._used[h]
            recorded = self._answers.get(h, [])
            self._used[h] += 1
        if k >= len(recorded):
            why = f"no recorded answer for prompt {h[:16]} ({prompt.role}; {len(recorded)} recorded, request {k + 1})"
            return LLMReply(f"replay-missing-{h[:16]}-{k}", Status.LLM_ERROR, None, why)
        r = recorded[k]
        if not r.response:
            return LLMReply(r.call_id, Status.LLM_ERROR, None, r.error or "recorded call has no response")
        return LLMReply(r.call_id, Status.OK, r.response)

    def record_outcome(self, call_id: str, status: Status, error: str) -> None:
        """Nothing to amend: the recorded rows are already in the store."""
        return None

    def take_rows(self) -> list[LLMCallRow]:
        """Always []: a replay makes no new calls."""
        return []

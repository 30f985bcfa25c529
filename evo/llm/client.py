"""LLM clients: litellm against any model string, a disabled one, and (in evo.llm.replay) a replay.

Every request becomes an `LLMCallRow`, kept until the caller takes it with `take_rows()` and writes
it (only the parent process writes the store). API keys are read by litellm from the environment,
never passed, stored or logged; any environment secret that turns up in a prompt, answer or error
text is masked before it is kept.

Budget: a call reserves its worst case (estimated prompt tokens + max_tokens, priced by litellm
where it knows the model) before it is sent; one that could exceed the USD or token budget is
refused without a request. Models litellm has no price for cost $0, but their tokens still count.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from evo.llm.prompts import Prompt
from evo.llm.secrets import redact
from evo.core.extras import require
from evo.core.llm_settings import LLMSettings
from evo.core.status import Status
from memory.rows import LLMCallRow

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class LLMReply:
    """The answer to one prompt: OK with text, or LLM_ERROR with the reason."""

    call_id: str
    status: Status
    text: str | None
    error: str = ""


class LLM(Protocol):
    """What the roles need from a client."""

    enabled: bool

    def complete(self, prompt: Prompt) -> LLMReply: ...

    def record_outcome(self, call_id: str, status: Status, error: str) -> None: ...

    def take_rows(self) -> list[LLMCallRow]: ...


def _litellm() -> Any:
    """litellm, imported on first use with the bundled cost map (no download on an offline machine)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm", "llm", "the LLM operator")

    litellm.suppress_debug_info = True
    return litellm


class Budget:
    """USD and token spending of one run, with reservations for calls in flight; thread-safe."""

    def __init__(self, usd: float, tokens: int) -> None:
        self.usd_cap = usd
        self.token_cap = tokens
        self.spent_usd = 0.0
        self.spent_tokens = 0
        self._held_usd = 0.0
        self._held_tokens = 0
        self._lock = threading.Lock()

    def reserve(self, usd: float, tokens: int) -> str:
        """Hold a call's worst case; the refusal reason, or '' when it fits."""
        with self._lock:
            if self.spent_usd + self._held_usd + usd > self.usd_cap:
                return (
                    f"budget exhausted: ${self.spent_usd:.4f} spent + ${self._held_usd:.4f} in flight + "
                    f"${usd:.4f} for this call > ${self.usd_cap:.4f}"
                )
            if self.token_cap and self.spent_tokens + self._held_tokens + tokens > self.token_cap:
                return (
                    f"budget exhausted: {self.spent_tokens} tokens spent + {self._held_tokens} in flight + "
                    f"{tokens} for this call > {self.token_cap}"
                )
            self._held_usd += usd
            self._held_tokens += tokens
            return ""

    def settle(self, held_usd: float, held_tokens: int, usd: float, tokens: int) -> None:
        """Replace a reservation by what the call actually cost."""
        with self._lock:
            self._held_usd -= held_usd
            self._held_tokens -= held_tokens
            self.spent_usd += usd
            self.spent_tokens += tokens


class _Rows:
    """Call rows waiting to be taken by the caller; outcomes may be amended until then."""

    def __init__(self) -> None:
        self._rows: dict[str, LLMCallRow] = {}
        self._lock = threading.Lock()

    def add(self, row: LLMCallRow) -> None:
        with self._lock:
            self._rows[row.call_id] = row

    def amend(self, call_id: str, status: Status, error: str) -> None:
        with self._lock:
            row = self._rows.get(call_id)
            if row is not None:
                self._rows[call_id] = dataclasses.replace(row, outcome=status.name, error=redact(error) or None)

    def take(self) -> list[LLMCallRow]:
        with self._lock:
            out = list(self._rows.values())
            self._rows.clear()
            return out


class DisabledLLM:
    """model = 'none': the LLM operator and roles are off; nothing is ever sent or recorded."""

    enabled = False

    def complete(self, prompt: Prompt) -> LLMReply:
        return LLMReply("", Status.LLM_ERROR, None, "LLM operator is off (llm.model = 'none')")

    def record_outcome(self, call_id: str, status: Status, error: str) -> None:
        return None

    def take_rows(self) -> list[LLMCallRow]:
        return []


def _retryable(e: Exception, litellm: Any) -> bool:
    """429, 408, 5xx, timeouts and dropped connections are worth another try; 4xx are not."""
    if isinstance(e, (litellm.Timeout, litellm.APIConnectionError, litellm.RateLimitError)):
        return True
    code = getattr(e, "status_code", None)
    return isinstance(code, int) and (code in (408, 429) or code >= 500)


def _describe(e: Exception, litellm: Any, settings: LLMSettings, tries: int) -> str:
    if isinstance(e, litellm.Timeout):
        return f"timeout: no answer within {settings.timeout_s:g} s ({tries} tries)"
    code = getattr(e, "status_code", None)
    head = f"{type(e).__name__}" + (f" (HTTP {code})" if code else "") + f" after {tries} tries"
    return f"{head}: {e}"[:MAX_ERROR_CHARS]


class LiteLLM:
    """A client for any litellm model string; one per run."""

    enabled = True

    def __init__(
        self, settings: LLMSettings, run_id: str, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if not settings.enabled:
            raise ValueError("LiteLLM needs a model; use make_llm() to get a DisabledLLM for model = 'none'")
        self.settings = settings
        self.run_id = run_id
        self.budget = Budget(settings.budget_usd, settings.budget_tokens)
        self._sleep = sleep
        self._slots = threading.BoundedSemaphore(settings.max_concurrency)
        self._rows = _Rows()

    def record_outcome(self, call_id: str, status: Status, error: str) -> None:
        """Amend a call's outcome once its answer has been judged (e.g. it did not parse)."""
        self._rows.amend(call_id, status, error)

    def take_rows(self) -> list[LLMCallRow]:
        """Call rows recorded since the last take, for the caller to write."""
        return self._rows.take()

    def _priced(self, litellm: Any) -> bool:
        model = self.settings.model
        return model in litellm.model_cost or model.split("/", 1)[-1] in litellm.model_cost

    def _estimate(self, litellm: Any, prompt: Prompt) -> tuple[float, int]:
        """Worst-case USD and tokens of a call: the prompt plus a completion of max_tokens."""
        prompt_tokens = litellm.token_counter(model=self.settings.model, text=prompt.text)
        tokens = prompt_tokens + self.settings.max_tokens
        if not self._priced(litellm):
            return 0.0, tokens
        p, c = litellm.cost_per_token(
            model=self.settings.model, prompt_tokens=prompt_tokens, completion_tokens=self.settings.max_tokens
        )
        return p + c, tokens

    def _row(self, call_id: str, prompt: Prompt, started: datetime, **fields: Any) -> LLMCallRow:
        return LLMCallRow(
            call_id=call_id,
            run_id=self.run_id,
            role=prompt.role,
            model=self.settings.model,
            prompt_hash=prompt.hash,
            prompt_template_hash=prompt.template_hash,
            prompt=prompt.text,
            created_at=started,  # the request's start, so replay can tell the order of repeated prompts
            **fields,
        )

    def complete(self, prompt: Prompt) -> LLMReply:
        """Send one prompt (with retries); never raises for a failed request."""
        litellm = _litellm()
        if (masked := redact(prompt.text)) != prompt.text:  # a Prompt built by hand, not by render_prompt
            prompt = dataclasses.replace(prompt, text=masked or "")
        call_id = uuid.uuid4().hex
        started = datetime.now(timezone.utc).replace(tzinfo=None)
        with self._slots:
            est_usd, est_tokens = self._estimate(litellm, prompt)
            refusal = self.budget.reserve(est_usd, est_tokens)
            if refusal:
                self._rows.add(
                    self._row(call_id, prompt, started, response=None, outcome=Status.LLM_ERROR.name, error=refusal)
                )
                log.warning("llm %s refused: %s (call %s)", prompt.role, refusal, call_id)
                return LLMReply(call_id, Status.LLM_ERROR, None, refusal)
            t0 = time.perf_counter()
            resp, error = self._send(litellm, prompt)
            latency = time.perf_counter() - t0
        usd, pt, ct, text = 0.0, None, None, None
        if resp is not None:
            usage = getattr(resp, "usage", None)
            pt = int(getattr(usage, "prompt_tokens", 0) or 0)
            ct = int(getattr(usage, "completion_tokens", 0) or 0)
            usd = float(litellm.completion_cost(completion_response=resp)) if self._priced(litellm) else 0.0
            text = resp.choices[0].message.content if resp.choices else None
            if not text:
                error = "empty answer (no message content)"
        self.budget.settle(est_usd, est_tokens, usd, (pt or 0) + (ct or 0))
        status = Status.LLM_ERROR if error else Status.OK
        text, error = redact(text), redact(error)
        self._rows.add(
            self._row(
                call_id,
                prompt,
                started,
                response=text,
                prompt_tokens=pt,
                completion_tokens=ct,
                cost_usd=usd,
                latency_s=latency,
                outcome=status.name,
                error=error or None,
            )
        )
        log.info(
            "llm %s %s: %s, %s+%s tokens, $%.5f, %.2f s (call %s)%s",
            prompt.role, self.settings.model, status.name, pt, ct, usd, latency, call_id,
            f": {error}" if error else "",
        )
        return LLMReply(call_id, status, text if status.ok else None, error or "")

    def _send(self, litellm: Any, prompt: Prompt) -> tuple[Any, str]:
        """The response, or None and why; retries transient failures with exponential backoff."""
        import openai  # a litellm dependency; imported with it

        s = self.settings
        kwargs: dict[str, Any] = dict(
            model=s.model,
            messages=[{"role": "user", "content": prompt.text}],
            timeout=s.timeout_s,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            drop_params=True,  # e.g. models that only take their default temperature
            max_retries=0,  # the OpenAI SDK's own retries would hide attempts from our bounded loop
            num_retries=0,
        )
        if s.api_base:
            kwargs["api_base"] = s.api_base
        for attempt in range(s.tries):
            try:
                return litellm.completion(**kwargs), ""
            except openai.OpenAIError as e:  # every litellm API error derives from it
                if not _retryable(e, litellm) or attempt + 1 == s.tries:
                    return None, _describe(e, litellm, s, attempt + 1)
                wait = s.backoff_s * 2**attempt
                log.info("llm %s: %s, retrying in %.2f s", prompt.role, type(e).__name__, wait)
                self._sleep(wait)
        raise AssertionError("unreachable: the last attempt returns")


def make_llm(settings: LLMSettings, run_id: str) -> LiteLLM | DisabledLLM:
    """The client an experiment asks for: DisabledLLM when model = 'none'."""
    return LiteLLM(settings, run_id) if settings.enabled else DisabledLLM()

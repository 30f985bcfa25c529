"""The litellm client against a real local OpenAI-compatible server: retries, timeouts, budgets, keys."""

from __future__ import annotations

import io
import logging
import time

import pytest

from evo.llm import LLMSettings, ReplayLLM, make_llm, propose_many, render_prompt
from evo.llm.client import DisabledLLM, LiteLLM
from evo.core.status import Status
from tests.unit.fake_llm_server import FakeLLMServer, Reply, parent_request

KEY = "sk-secret-123"
UNPRICED = "openai/kf-test-model"  # litellm has no price for it: $0, tokens still count
PRICED = "openai/gpt-4o-mini"  # priced from litellm's bundled cost map


def settings(server: FakeLLMServer, **kw) -> LLMSettings:
    base = dict(model=UNPRICED, api_base=server.api_base, timeout_s=5.0, backoff_s=0.01, max_tokens=500)
    return LLMSettings(**(base | kw))


def ask(text: str = "Say hello."):
    return render_prompt("lesson_writer", op="rmsnorm", arch="sm_90a", scope=text, columns=["param"], rows=[["vec"]])


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def test_answer_tokens_and_row():
    with FakeLLMServer([Reply("LESSON: vec=8 wins.", prompt_tokens=321, completion_tokens=12)]) as srv:
        llm = LiteLLM(settings(srv), run_id="r1")
        p = ask()
        reply = llm.complete(p)
    assert reply.status is Status.OK and reply.text == "LESSON: vec=8 wins."
    (row,) = llm.take_rows()
    assert (row.call_id, row.run_id, row.role, row.model) == (reply.call_id, "r1", "lesson_writer", UNPRICED)
    assert (row.prompt_tokens, row.completion_tokens, row.cost_usd, row.outcome) == (321, 12, 0.0, "OK")
    assert row.prompt == p.text and row.prompt_hash == p.hash and row.prompt_template_hash == p.template_hash
    assert row.response == reply.text and row.error is None and row.latency_s > 0
    assert llm.budget.spent_tokens == 333 and llm.take_rows() == []
    assert srv.requests[0]["model"] == "kf-test-model" and srv.requests[0]["max_tokens"] == 500


def test_429_then_success_retries_once():
    with FakeLLMServer([Reply(status=429), Reply("LESSON: ok.")]) as srv:
        llm = LiteLLM(settings(srv), run_id="r")
        reply = llm.complete(ask())
    assert reply.status is Status.OK and len(srv.requests) == 2
    assert [r.outcome for r in llm.take_rows()] == ["OK"]


def test_retries_are_bounded():
    with FakeLLMServer([Reply(status=503)] * 5) as srv:
        reply = LiteLLM(settings(srv, tries=3), run_id="r").complete(ask())
    assert reply.status is Status.LLM_ERROR and len(srv.requests) == 3
    assert "HTTP 503" in reply.error and "3 tries" in reply.error


def test_client_error_is_not_retried():
    with FakeLLMServer([Reply(status=400), Reply("LESSON: never sent.")]) as srv:
        reply = LiteLLM(settings(srv), run_id="r").complete(ask())
    assert reply.status is Status.LLM_ERROR and len(srv.requests) == 1 and "HTTP 400" in reply.error


def test_slow_answer_is_a_bounded_timeout():
    with FakeLLMServer([Reply("late", delay_s=10.0)] * 2, max_seconds=15) as srv:
        llm = LiteLLM(settings(srv, timeout_s=0.3, tries=2), run_id="r")
        t0 = time.monotonic()
        reply = llm.complete(ask())
        took = time.monotonic() - t0
    assert reply.status is Status.LLM_ERROR and reply.error.startswith("timeout")
    assert len(srv.requests) == 2 and took < 3.0
    (row,) = llm.take_rows()
    assert row.outcome == "LLM_ERROR" and row.error.startswith("timeout") and row.response is None
    assert ReplayLLM([row]).complete(ask()) == reply  # a recorded failure replays as the same failure


def test_usd_budget_refuses_without_a_request():
    with FakeLLMServer([Reply("LESSON: a.", prompt_tokens=1000, completion_tokens=500)] * 3) as srv:
        llm = LiteLLM(settings(srv, model=PRICED, budget_usd=0.0007), run_id="r")
        # Worst case ~250 prompt + 500 completion tokens = $0.00034 fits; after $0.00045 spent it no longer does.
        first = llm.complete(ask("one"))
        second = llm.complete(ask("two"))
        rows = llm.take_rows()
    assert first.status is Status.OK and len(srv.requests) == 1
    assert 0 < rows[0].cost_usd == pytest.approx(1000 * 0.15e-6 + 500 * 0.6e-6)
    assert second.status is Status.LLM_ERROR and second.error.startswith("budget exhausted")
    assert rows[1].outcome == "LLM_ERROR" and rows[1].response is None and rows[1].cost_usd is None


def test_usd_budget_zero_allows_unpriced_models_only():
    with FakeLLMServer([Reply("LESSON: a.")]) as srv:
        assert LiteLLM(settings(srv, model=PRICED), run_id="r").complete(ask()).error.startswith("budget exhausted")
        assert LiteLLM(settings(srv), run_id="r").complete(ask()).status is Status.OK
        assert len(srv.requests) == 1


def test_token_budget_counts_unpriced_models():
    with FakeLLMServer([Reply("LESSON: a.", prompt_tokens=400, completion_tokens=100)] * 3) as srv:
        llm = LiteLLM(settings(srv, budget_tokens=1000, max_tokens=500), run_id="r")
        # A call reserves its prompt (~250 tokens) + max_tokens; after 500 spent, the second no longer fits.
        assert llm.complete(ask()).status is Status.OK
        refused = llm.complete(ask())
    assert refused.error.startswith("budget exhausted") and "tokens" in refused.error
    assert len(srv.requests) == 1 and llm.budget.spent_tokens == 500


def test_concurrency_limit():
    n = 6
    with FakeLLMServer([Reply("LESSON: a.", delay_s=0.2)] * n) as srv:
        llm = LiteLLM(settings(srv, max_concurrency=2), run_id="r")
        reqs = [parent_request(lessons=(f"lesson {i}",)) for i in range(n)]
        props = propose_many(llm, reqs, max_concurrency=n)
    assert len(props) == n and len(srv.requests) == n
    assert srv.max_in_flight == 2


def test_key_never_stored_or_logged(capfd):
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    loggers = [logging.getLogger(n) for n in ("", "evo.llm", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        with FakeLLMServer([Reply(status=429), Reply("LESSON: vec=8."), Reply(status=401)]) as srv:
            llm = LiteLLM(settings(srv), run_id="r")
            ok = llm.complete(ask())
            denied = llm.complete(ask("again"))
            rows = llm.take_rows()
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(lvl)
    assert any(KEY in v for h in srv.headers for v in h.values())  # it was really sent
    assert ok.status is Status.OK and denied.status is Status.LLM_ERROR and "HTTP 401" in denied.error
    out, err = capfd.readouterr()
    assert "llm lesson_writer" in buf.getvalue()  # the handler did capture our log lines
    assert KEY not in buf.getvalue() and KEY not in out + err
    assert len(rows) == 2 and all(KEY not in repr(row) for row in rows)


def test_key_in_a_prompt_or_answer_is_masked():
    with FakeLLMServer([Reply(f"LESSON: the key is {KEY}")]) as srv:
        llm = LiteLLM(settings(srv), run_id="r")
        p = ask(f"a log line that leaked {KEY}")
        reply = llm.complete(p)
        (row,) = llm.take_rows()
    assert KEY not in p.text and "***" in p.text
    assert KEY not in srv.requests[0]["messages"][0]["content"]  # never sent either
    assert KEY not in reply.text and KEY not in repr(row) and "***" in row.response


def test_settings_from_the_config_section():
    from evo.core.config import parse_config

    section = parse_config('[run]\nop = "rmsnorm"\n[llm]\nmodel = "openai/m"\nbudget_usd = 2.5\n').llm
    s = LLMSettings.of(section)
    assert (s.model, s.budget_usd, s.budget_tokens, s.tries) == ("openai/m", 2.5, 0, 3) and s.enabled
    assert not LLMSettings.of(parse_config('[run]\nop = "rmsnorm"\n').llm).enabled
    with pytest.raises(ValueError, match="tries"):
        LLMSettings(tries=0)


def test_model_none_is_off():
    llm = make_llm(LLMSettings(), run_id="r")
    assert isinstance(llm, DisabledLLM) and not llm.enabled
    assert propose_many(llm, [parent_request()]) == [] and llm.take_rows() == []
    assert llm.complete(ask()).status is Status.LLM_ERROR


def test_replay_unknown_prompt_is_an_error():
    reply = ReplayLLM([]).complete(ask())
    assert reply.status is Status.LLM_ERROR and "no recorded answer" in reply.error


def test_replay_answers_repeated_prompts_in_recorded_order():
    with FakeLLMServer([Reply("LESSON: first."), Reply("LESSON: second.")]) as srv:
        llm = LiteLLM(settings(srv), run_id="r")
        live = [llm.complete(ask()), llm.complete(ask())]
        rows = llm.take_rows()
    replay = ReplayLLM(rows)
    assert [replay.complete(ask()) for _ in range(2)] == live
    assert "no recorded answer" in replay.complete(ask()).error

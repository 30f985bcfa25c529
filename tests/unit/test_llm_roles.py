"""The failure analyst and the lesson writer: parsed records, and LLM_ERROR records for bad answers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from evo.llm import FailureExample, LiteLLM, LLMSettings, ReplayLLM, analyze_failures, lesson_row, write_lesson
from evo.llm.roles import read_failure_lesson, read_written_lesson
from evo.core.status import Status
from tests.unit.fake_llm_server import FakeLLMServer, Reply, prompt_of

GOOD = (
    "LESSON: vec * x_bytes above 16 asks kf::load for more than one 16-byte vector per lane.\n"
    "```json\n"
    '{"condition": "vec * x_bytes > 16", "predicts": "COMPILE_ERROR"}\n'
    "```\n"
)
FAILURES = [
    FailureExample("warp_row", {"vec": 8, "threads": 128}, Status.COMPILE_ERROR, "error: static assertion failed",
                   "line 1: error: static assertion failed\n" * 50),
    FailureExample("warp_row", {"vec": 8, "threads": 256}, Status.COMPILE_ERROR, "error: static assertion failed"),
]
STATS = pd.DataFrame([
    {"param": "vec", "value": 8, "n": 40, "mean_speedup": 1.31, "failure_rate": 0.05},
    {"param": "vec", "value": 1, "n": 38, "mean_speedup": 0.62, "failure_rate": 0.0},
    {"param": "load_hint", "value": "nc", "n": 12, "mean_speedup": 1.04, "failure_rate": 0.0},
])


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0000")


def client(srv):
    return LiteLLM(LLMSettings(model="openai/kf-test-model", api_base=srv.api_base, backoff_s=0.01), run_id="r")


def test_failure_analyst_returns_a_rule():
    with FakeLLMServer([Reply(GOOD)]) as srv:
        llm = client(srv)
        lesson = analyze_failures(llm, "rmsnorm", "sm_90a", FAILURES)
        (row,) = llm.take_rows()
    assert lesson.status is Status.OK and lesson.predicts is Status.COMPILE_ERROR
    assert lesson.condition == "vec * x_bytes > 16" and lesson.text.startswith("vec * x_bytes above 16")
    assert row.role == "failure_analyst" and row.outcome == "OK" and row.call_id == lesson.call_id
    prompt = prompt_of(srv.requests[0])
    assert "threads=128, vec=8" in prompt and "static assertion failed" in prompt and "COMPILE_ERROR" in prompt
    assert prompt.count("line 1: error") == 30  # log excerpts are bounded
    r = lesson_row(lesson, op="rmsnorm", arch="sm_90a", run_id="r", scope={"template": "warp_row"}, support=2)
    assert r.kind == "llm_failure" and r.support == 2 and r.text == lesson.text
    assert json.loads(r.structured_json) == {"condition": "vec * x_bytes > 16", "predicts": "COMPILE_ERROR"}
    assert json.loads(r.provenance_json) == {"llm_call_id": lesson.call_id, "role": "failure_analyst"}
    again = lesson_row(lesson, op="rmsnorm", arch="sm_90a", run_id="r2", scope={"template": "warp_row"})
    assert again.lesson_id == r.lesson_id  # same scope, same row: a later analysis updates it


@pytest.mark.parametrize("answer, why", [
    ("LESSON: it fails.", "no JSON object"),
    ('LESSON: x.\n```json\n{"condition": "vec > 4", "predicts": "SLOW"}\n```', '"predicts" must be one of'),
    ('LESSON: x.\n```json\n{"condition": "vec > ", "predicts": "COMPILE_ERROR"}\n```', '"condition"'),
    ('LESSON: x.\n```json\n{"condition": "warps > 4", "predicts": "COMPILE_ERROR"}\n```', "unknown names ['warps']"),
    ('LESSON: x.\n```json\n{"condition": "vec.__class__", "predicts": "CRASH"}\n```', "__class__"),
    ('LESSON: x.\n```json\n{"condition": "", "predicts": "CRASH"}\n```', "non-empty string"),
    ('```json\n{"condition": "vec > 4", "predicts": "CRASH"}\n```', "no lesson text"),
    ("LESSON: " + "very " * 300 + "long.\n" + '{"condition": "vec > 4", "predicts": "CRASH"}', "at most 800"),
    ('{"condition": "vec > 4", "predicts": "CRASH"', "no JSON object"),
], ids=["no-json", "bad-status", "syntax", "unknown-name", "dunder", "empty", "no-text", "too-long", "broken-json"])
def test_failure_analyst_malformed_answers(answer, why):
    r = read_failure_lesson(answer, ["vec", "threads"])
    assert not r.ok and why in r.reason, r.reason


def test_bare_json_and_dims_are_accepted():
    r = read_failure_lesson('vec too wide for short rows. {"condition": "vec * 32 > N", "predicts": "wrong_answer"}',
                            ["vec"])
    assert r.ok and r.text == "vec too wide for short rows." and r.predicts is Status.WRONG_ANSWER


def test_malformed_analyst_answer_is_a_record_not_an_exception():
    with FakeLLMServer([Reply("I am not sure what went wrong.")]) as srv:
        llm = client(srv)
        lesson = analyze_failures(llm, "rmsnorm", "sm_90a", FAILURES)
        (row,) = llm.take_rows()
    assert lesson.status is Status.LLM_ERROR and "no JSON object" in lesson.reason and lesson.predicts is None
    assert row.outcome == "LLM_ERROR" and row.error == lesson.reason
    with pytest.raises(ValueError, match="not accepted"):
        lesson_row(lesson, op="rmsnorm", arch="sm_90a", run_id="r", scope={})


def test_lesson_writer():
    answer = "LESSON: Prefer vec=8 (1.31x over 40 evaluations); vec=1 is about half as fast. load_hint is untested."
    with FakeLLMServer([Reply(answer), Reply("```python\nprint(1)\n```"), Reply("LESSON: Be fast.")]) as srv:
        llm = client(srv)
        good = write_lesson(llm, "rmsnorm", "sm_90a", STATS, scope="bf16, N >= 4096")
        code = write_lesson(llm, "rmsnorm", "sm_90a", STATS.iloc[:2])
        vague = write_lesson(llm, "rmsnorm", "sm_90a", STATS.iloc[:1])
        rows = llm.take_rows()
    assert good.status is Status.OK and good.text == answer.removeprefix("LESSON: ")
    note = lesson_row(good, op="rmsnorm", arch="sm_90a", run_id="r", scope={"dtype": "bfloat16"})
    assert note.kind == "llm_note" and note.structured_json == "{}" and good.call_id in note.provenance_json
    prompt = prompt_of(srv.requests[0])
    assert "| param | value | n | mean_speedup | failure_rate |" in prompt
    assert "| vec | 8 | 40 | 1.31 | 0.05 |" in prompt
    assert "bf16, N >= 4096" in prompt
    assert code.status is Status.LLM_ERROR and "code block" in code.reason
    assert vague.status is Status.LLM_ERROR and "names none of the parameters" in vague.reason
    assert [r.outcome for r in rows] == ["OK", "LLM_ERROR", "LLM_ERROR"]
    assert all(r.role == "lesson_writer" for r in rows)


def test_lesson_writer_text_without_marker():
    assert read_written_lesson("Prefer vec=8.\n", ["vec"]).text == "Prefer vec=8."


def test_roles_replay_identically():
    with FakeLLMServer([Reply(GOOD), Reply("LESSON: Prefer vec=8.")]) as srv:
        llm = client(srv)
        live = (analyze_failures(llm, "rmsnorm", "sm_90a", FAILURES), write_lesson(llm, "rmsnorm", "sm_90a", STATS))
        rows = llm.take_rows()
    replay = ReplayLLM(pd.DataFrame([vars(r) for r in rows]))
    again = (analyze_failures(replay, "rmsnorm", "sm_90a", FAILURES), write_lesson(replay, "rmsnorm", "sm_90a", STATS))
    assert again == live
    assert replay.take_rows() == []

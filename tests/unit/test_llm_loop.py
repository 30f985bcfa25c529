"""The whole loop: propose -> parse -> build (real NVRTC) -> rows in a real DuckDB store -> failure analyst,
then the same run replayed from the stored llm_calls with the server gone, and its cost in SQL."""

from __future__ import annotations

import json

import pytest

from evo.build.nvrtc import compile_one, prepare
from evo.llm import (
    FailureExample,
    LiteLLM,
    LLMSettings,
    ReplayLLM,
    analyze_failures,
    child_genome,
    lesson_row,
    proposal_rows,
    proposal_template,
    propose_many,
)
from evo.llm.prompts import prompt_template_source, sha256
from evo.core.status import Status
from memory.llm import cost_per_accepted
from memory.rows import BuildRow, CandidateRow, EvaluationRow, RunRow, SourceRow, canonical_json
from memory.store import Store
from tests.unit.fake_llm_server import (
    BF16,
    FakeLLMServer,
    Reply,
    edits,
    improved_warp_row,
    parent_request,
    prompt_of,
    whole,
)

KEY = "sk-secret-123"
RUN = "run-llm-loop"
CELL = "bfloat16 M=4096 N=4096"
REQ = parent_request()
ANSWERS = {
    "This is request 1 for this parent": whole(improved_warp_row(REQ.template_text)),
    "This is request 2 for this parent": edits(
        ("  const float inv_n = 1.0f / (float)N;", "  const float inv_n = 1.0f / (float)N_undeclared;")
    ),
    "This is request 3 for this parent": whole(
        REQ.template_text.replace("{% set XB", "{{ ''.__class__.__mro__[1].__subclasses__() }}\n{% set XB", 1)
    ),
    "reviewing failed kernel candidates": (
        "LESSON: The variant divides by N_undeclared, a name no template declares, so every point of it fails "
        'to compile.\n```json\n{"condition": "true", "predicts": "COMPILE_ERROR"}\n```\n'
    ),
}


def answer(body, n):
    prompt = prompt_of(body)
    (reply,) = [a for marker, a in ANSWERS.items() if marker in prompt]
    return Reply(reply, prompt_tokens=3000 + n, completion_tokens=400)


def candidate(g, origin, parents=()):
    return CandidateRow(genome_key=g.key(), op=g.op, template=g.template, source_hash=g.source_hash,
                        params_json=g.params_json(), origin=origin, parents_json=json.dumps(list(parents)),
                        run_id=RUN, generation=0 if origin == "file" else 1)


def measured(g, us, build_key=None):
    # Timings stand in for the GPU here (no device in unit tests), so they are marked as replayed.
    return EvaluationRow(eval_id=f"{g.key()[:16]}-{CELL}", run_id=RUN, genome_key=g.key(), build_key=build_key,
                         cell=CELL, dtypes_json=canonical_json(BF16), dims_json=canonical_json({"M": 4096, "N": 4096}),
                         status=Status.OK, median_us=us, source="replay")


def test_propose_build_store_analyze_replay(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    reqs = [REQ, REQ, REQ]  # three variants of one parent; propose_many numbers them
    with FakeLLMServer(answer, max_requests=8) as srv:
        settings = LLMSettings(model="openai/gpt-4o-mini", api_base=srv.api_base, budget_usd=1.0, backoff_s=0.01)
        llm = LiteLLM(settings, run_id=RUN)
        proposals = propose_many(llm, reqs, max_concurrency=3)
        assert [p.status for p in proposals] == [Status.OK, Status.OK, Status.LLM_ERROR]
        assert "__class__" in proposals[2].reason

        builds = [compile_one(prepare(proposal_template(p), child_genome(p), "sm_90a", BF16, {}))
                  for p in proposals[:2]]
        assert [b.status for b in builds] == [Status.OK, Status.COMPILE_ERROR], builds[0].error

        bad, bad_build = proposals[1], builds[1]
        failure = FailureExample(child_genome(bad).template, child_genome(bad).params_dict(), bad_build.status,
                                 bad_build.error, bad_build.log)
        lesson = analyze_failures(llm, "rmsnorm", "sm_90a", [failure], template_text=bad.template_text)
        calls = llm.take_rows()
    assert len(srv.requests) == 4
    assert lesson.status is Status.OK and "N_undeclared" in lesson.text and lesson.predicts is Status.COMPILE_ERROR
    assert "N_undeclared" in prompt_of(srv.requests[3])  # the compile log reached the analyst

    parent = REQ.parent
    children = [child_genome(p) for p in proposals[:2]]
    rows = [RunRow(run_id=RUN, op="rmsnorm", arch="sm_90a", config_toml="", config_hash="", seed=0, status="done"),
            SourceRow.of(REQ.template_text, op="rmsnorm", template="warp_row", origin="file"),
            candidate(parent, "file"), measured(parent, 21.4)]
    for p, g, b in zip(proposals[:2], children, builds, strict=True):
        rows += proposal_rows(p, REQ) + [candidate(g, "llm", [parent.key()])]
        rows.append(BuildRow(build_key=b.build_key, genome_key=g.key(), run_id=RUN, arch="sm_90a",
                             dtypes_json=canonical_json(BF16), consts_json="{}", status=b.status, regs=b.regs,
                             log=b.log, error=b.error, cubin=b.cubin))
    rows.append(measured(children[0], 19.0, builds[0].build_key))
    rows += calls + [lesson_row(lesson, op="rmsnorm", arch="sm_90a", run_id=RUN, support=1,
                                scope={"template": children[1].template, "status": "COMPILE_ERROR"})]
    with Store.open(tmp_path / "lessons.duckdb") as store:
        store.write(rows)

        src = store.sql("SELECT * FROM sources WHERE origin = 'llm' ORDER BY template")
        assert len(src) == 2 and set(src.parent_hash) == {parent.source_hash}
        assert set(src.template) == {g.template for g in children}
        llm_calls = store.sql("SELECT * FROM llm_calls ORDER BY created_at, call_id")
        assert len(llm_calls) == 4 and set(src.llm_call_id) <= set(llm_calls.call_id)
        assert sorted(llm_calls.role) == ["failure_analyst", "mutate", "mutate", "mutate"]
        assert sorted(llm_calls.outcome) == ["LLM_ERROR", "OK", "OK", "OK"]
        mutate_calls = llm_calls[llm_calls.role == "mutate"]
        assert (mutate_calls.prompt_template_hash == sha256(prompt_template_source("mutate"))).all()
        assert (llm_calls.prompt_hash == llm_calls.prompt.map(sha256)).all()
        assert (llm_calls.cost_usd > 0).all() and (llm_calls.completion_tokens == 400).all()
        assert store.sql("SELECT text FROM lessons").text[0] == lesson.text
        for table in ("runs", "sources", "candidates", "builds", "evaluations", "lessons", "llm_calls"):
            assert KEY not in store.sql(f"SELECT * FROM {table}").to_csv(), table

        cost = cost_per_accepted(store)
        mutate_usd = llm_calls[llm_calls.role == "mutate"].cost_usd.sum()
        assert len(cost) == 1 and cost.run_id[0] == RUN and cost.calls[0] == 3 and cost.accepted[0] == 1
        assert cost.usd_per_accepted[0] == pytest.approx(mutate_usd)
        assert cost.tokens_per_accepted[0] == llm_calls[llm_calls.role == "mutate"].eval(
            "prompt_tokens + completion_tokens").sum()

        recorded = store.sql("SELECT * FROM llm_calls")

    # The server is gone: a replay of the stored calls gives the same proposals, rows and lesson.
    replay = ReplayLLM(recorded)
    assert propose_many(replay, reqs, max_concurrency=3) == proposals
    assert [proposal_rows(p, REQ) for p in proposals] == [proposal_rows(p, REQ) for p in propose_many(
        ReplayLLM(recorded), reqs, max_concurrency=1)]
    assert analyze_failures(replay, "rmsnorm", "sm_90a", [failure], template_text=bad.template_text) == lesson
    assert replay.take_rows() == []

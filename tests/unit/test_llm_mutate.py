"""The LLM mutation operator end to end through litellm and a local server, built with real NVRTC."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import compile_one, prepare
from evo.llm import LiteLLM, LLMSettings, child_genome, proposal_rows, proposal_template, propose_one
from evo.llm.mutate import child_name, mutation_prompt, read_proposal, rename_template
from evo.llm.prompts import prompt_template_source, sha256
from evo.core.status import Status
from evo.templates.template import parse_template
from tests.unit.fake_llm_server import BF16, FakeLLMServer, Reply, edits, improved_warp_row, parent_request, whole

REQ = parent_request()
PARENT = REQ.template_text
BAD_CODE = edits(("  const float inv_n = 1.0f / (float)N;", "  const float inv_n = 1.0f / (float)N_undeclared;"))
MISSING = edits(("  const float inv_n = 1.0f / (float)M;", "  const float inv_n = 0.5f;"))
INJECTION = whole(PARENT.replace("{% set XB", "{{ cycler.__init__.__globals__.os.popen('id').read() }}\n{% set XB", 1))


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0000")


def client(srv: FakeLLMServer, **kw) -> LiteLLM:
    s = dict(model="openai/kf-test-model", api_base=srv.api_base, timeout_s=5.0, backoff_s=0.01) | kw
    return LiteLLM(LLMSettings(**s), run_id="run-mutate")


def build(p):
    t = proposal_template(p)
    return compile_one(prepare(t, child_genome(p), "sm_90a", BF16, {}))


def test_prompt_carries_the_parent_and_both_hashes():
    p = mutation_prompt(REQ)
    assert p.role == "mutate" and p.template_hash == sha256(prompt_template_source("mutate"))
    assert p.hash == sha256(p.text) and p.hash == mutation_prompt(parent_request()).hash  # deterministic
    for part in (PARENT.strip(), "21.40 us", "78.0%", "registers per thread: 79", "vec=8 with load_hint",
                 "RESOURCE_ERROR", "threads=128", "<<<<<<< SEARCH", "{#- kfactory ... -#}"):
        assert part in p.text
    assert mutation_prompt(parent_request(variant=1)).hash != p.hash


def test_valid_improvement_compiles():
    with FakeLLMServer([Reply(whole(improved_warp_row(PARENT)))]) as srv:
        llm = client(srv)
        p = propose_one(llm, REQ)
        (row,) = llm.take_rows()
    assert p.status is Status.OK and p.reason == "" and p.call_id == row.call_id and row.outcome == "OK"
    t = proposal_template(p)
    assert t.name == child_name("warp_row", improved_warp_row(PARENT)) and t.name.startswith("warp_row~")
    assert len(t.name) == len("warp_row~") + 6 and t.op == "rmsnorm"
    assert t.default_params()["threads"] == 256 and 8 in t.values("unroll")
    g = child_genome(p)
    assert g.template == t.name and g.text == p.template_text and g.source_hash == t.source_hash
    r = build(p)
    assert r.status is Status.OK, r.error + r.log
    assert r.cubin[:4] == b"\x7fELF" and r.regs > 0
    (src,) = proposal_rows(p, REQ)
    assert (src.origin, src.template, src.llm_call_id) == ("llm", t.name, p.call_id)
    assert src.parent_hash == REQ.parent.source_hash
    assert src.source_hash == t.source_hash and src.text == p.template_text


def test_edit_that_does_not_compile_is_a_compile_error():
    with FakeLLMServer([Reply(BAD_CODE)]) as srv:
        p = propose_one(client(srv), REQ)
    assert p.status is Status.OK  # the edit applies and is safe: only the compiler can tell
    r = build(p)
    assert r.status is Status.COMPILE_ERROR and "N_undeclared" in r.log and r.cubin == b""


def test_malformed_edit_is_an_llm_error():
    with FakeLLMServer([Reply(MISSING)]) as srv:
        llm = client(srv)
        p = propose_one(llm, REQ)
        (row,) = llm.take_rows()
    assert (p.status, p.template_text) == (Status.LLM_ERROR, None) and "SEARCH text not found" in p.reason
    assert row.outcome == "LLM_ERROR" and row.error == p.reason and row.response == MISSING
    assert proposal_rows(p, REQ) == []


def test_injection_attempt_is_an_llm_error():
    with FakeLLMServer([Reply(INJECTION)]) as srv:
        p = propose_one(client(srv), REQ)
    assert p.status is Status.LLM_ERROR and "unsafe template" in p.reason and "__globals__" in p.reason


def test_slow_answer_is_an_llm_error_timeout():
    with FakeLLMServer([Reply(whole(improved_warp_row(PARENT)), delay_s=10.0)] * 2, max_seconds=15) as srv:
        p = propose_one(client(srv, timeout_s=0.3, tries=2), REQ)
    assert p.status is Status.LLM_ERROR and p.reason.startswith("timeout") and len(srv.requests) == 2


def test_rate_limited_then_answered():
    with FakeLLMServer([Reply(status=429), Reply(whole(improved_warp_row(PARENT)))]) as srv:
        p = propose_one(client(srv), REQ)
    assert p.status is Status.OK and len(srv.requests) == 2


@pytest.mark.parametrize("answer, why", [
    (whole(PARENT.replace('op = "rmsnorm"', 'op = "layernorm"')), "declares op 'layernorm'"),
    (whole(PARENT.replace("[defaults]\nthreads = 128", "[defaults]\nthreads = 96")), "not a valid template"),
    (whole(PARENT.replace("rmsnorm_warp_row(const", "other_kernel(const")), "does not define: ['rmsnorm_warp_row']"),
    (whole(PARENT), "does not change the parent"),
    (whole(PARENT.replace('name = "warp_row"', 'name = "warp_row_v2"').replace("  ", "    ")), "does not change"),
    ("The parent is already optimal.", "neither a whole template"),
], ids=["other-op", "bad-header", "undefined-kernel", "unchanged", "renamed-only", "no-template"])
def test_unusable_answers(answer, why):
    status, text, reason = read_proposal(answer, REQ)
    assert (status, text) == (Status.LLM_ERROR, None) and why in reason, reason


def test_rename_keeps_lineage_short():
    grandchild = rename_template(PARENT, "warp_row~abcdef")
    assert parse_template(grandchild).name == "warp_row~abcdef"
    assert child_name("warp_row~abcdef", "x").count("~") == 1
    # Only [template].name changes, even if a parameter were called 'name'.
    assert rename_template(PARENT, "z").count('name = "z"') == 1

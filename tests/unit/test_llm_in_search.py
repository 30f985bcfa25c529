"""`kfactory run` with the LLM operator over real HTTP (a scripted server on 127.0.0.1), then the same
run replayed from the stored llm_calls with the server gone."""

from __future__ import annotations

from pathlib import Path


from evo.cli.main import main
from memory.rows import LLMCallRow
from memory.store import Store
from tests.unit.fake_llm_server import FakeLLMServer, Reply, improved_warp_row, whole
from tests.unit.test_search_replay import SMALL

ROOT = Path(__file__).resolve().parents[2]


def _answer(body, n):
    prompt = body["messages"][-1]["content"]
    parent = (ROOT / "templates" / "rmsnorm" / "warp_row.cu.j2").read_text()
    if "cta_row" in prompt.split("```")[0][-400:] and "name = \"cta_row\"" in prompt:
        return Reply("I cannot improve this one.")  # no template: an LLM_ERROR record
    return Reply(whole(improved_warp_row(parent)), prompt_tokens=2000, completion_tokens=300)


def _config(tmp_path: Path, llm: str) -> Path:
    text = SMALL.replace("{gens}", "3").replace("[build]", llm + "\n[build]")
    p = tmp_path / "llm.toml"
    p.write_text(text)
    return p


def _rows(store: Path, run_id: str):
    with Store.open(store, read_only=True) as s:
        calls = s.sql("SELECT prompt_hash, outcome, prompt, response FROM llm_calls WHERE run_id = ? "
                      "ORDER BY created_at", [run_id])
        llm_sources = s.sql("SELECT source_hash, parent_hash, llm_call_id FROM sources WHERE origin = 'llm'")
        kids = s.sql("SELECT genome_key, template, parents_json FROM candidates WHERE origin = 'llm' AND run_id = ?",
                     [run_id])
        built = s.sql("SELECT b.status FROM builds b JOIN candidates c USING (genome_key) "
                      "WHERE c.origin = 'llm' AND b.run_id = ?", [run_id])
    return calls, llm_sources, kids, built


def test_llm_operator_in_a_run_and_its_exact_replay(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-in-search")
    with FakeLLMServer(_answer, max_requests=20, max_seconds=120) as srv:
        llm = f'[llm]\nmodel = "openai/test-model"\napi_base = "{srv.api_base}"\nbudget_usd = 1.0\nbackoff_s = 0.01\n'
        assert main(["run", str(_config(tmp_path, llm)), "--store", str(tmp_path / "s.duckdb"), "--run-id", "live"]) == 0
    assert len(srv.requests) >= 2
    calls, sources, kids, built = _rows(tmp_path / "s.duckdb", "live")
    assert len(calls) == len(srv.requests)
    assert (calls.outcome == "OK").any()
    assert len(sources) >= 1 and sources.parent_hash.notna().all() and sources.llm_call_id.notna().all()
    assert len(kids) >= 1 and all(t.startswith("warp_row~") for t in kids.template)
    assert all("[\"" in p for p in kids.parents_json)  # each LLM child names its parent genome
    assert (built.status == "OK").all() and len(built) > 0  # really compiled with NVRTC
    for col in ("prompt", "response"):
        assert not calls[col].str.contains("sk-secret-in-search").any()

    # Replay from the same starting state (a store holding only the recorded calls): the server is
    # gone; answers come from the stored calls by prompt hash, and the run comes out identical.
    with Store.open(tmp_path / "s.duckdb", read_only=True) as s:
        recorded = s.sql("SELECT * FROM llm_calls WHERE run_id = 'live'")
        a = s.sql("SELECT genome_key, cell, status FROM evaluations WHERE run_id = 'live' ORDER BY 1, 2")
    store2 = tmp_path / "replay.duckdb"
    with Store.open(store2) as s:
        s.write([LLMCallRow(**{k: (None if v != v else v) for k, v in r.items()}) for r in recorded.to_dict("records")])
    llm = '[llm]\nmodel = "openai/test-model"\napi_base = "http://127.0.0.1:9/v1"\nreplay_run = "live"\n'
    assert main(["run", str(_config(tmp_path, llm)), "--store", str(store2), "--run-id", "again"]) == 0
    with Store.open(store2, read_only=True) as s:
        b = s.sql("SELECT genome_key, cell, status FROM evaluations WHERE run_id = 'again' ORDER BY 1, 2")
        kids = s.sql("SELECT count(*) AS n FROM candidates WHERE origin = 'llm'").n[0]
    assert kids >= 1
    assert a.equals(b)

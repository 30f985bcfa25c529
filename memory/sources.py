"""Template texts and the candidates made from them, read back."""

from __future__ import annotations

from collections.abc import Sequence

from memory.store import Store


def llm_sources(store: Store, run_id: str) -> list[tuple[str, str]]:
    """(source_hash, text) of the LLM-written templates the run's candidates use."""
    df = store.sql("SELECT DISTINCT s.source_hash, s.text FROM sources s JOIN candidates c USING (source_hash) "
                   "WHERE s.origin = 'llm' AND c.run_id = ?", [run_id])
    return list(zip(df.source_hash, df.text))


def source_texts(store: Store, source_hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """source_hash -> (text, origin) of the stored ones among these sources."""
    df = store.sql("SELECT source_hash, text, origin FROM sources WHERE list_contains(?::VARCHAR[], source_hash)",
                   [list(source_hashes)])
    return {r.source_hash: (r.text, r.origin) for r in df.itertuples(index=False)}


def candidate_params(store: Store, genome_key: str) -> tuple[str, str] | None:
    """(template, params_json) of the candidate with this genome key, or None."""
    df = store.sql("SELECT template, params_json FROM candidates WHERE genome_key = ?", [genome_key])
    return None if df.empty else (df.template[0], df.params_json[0])

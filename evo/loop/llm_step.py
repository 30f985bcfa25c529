"""The LLM operator inside the search loop: ask for template variants of the current best genomes.

Each generation, for up to `llm.proposals_per_generation` parents (the best genome of randomly
chosen cells), the model sees the parent's template and rendered source, its latest measurements,
and the top lessons and recent failures for this op and arch; an applicable answer becomes a new
template (recorded content-addressed with its parent and the call) whose default point joins the batch.
"""

from __future__ import annotations

import random
from typing import Any

from evo.build.nvrtc import prepare
from evo.core.genome import Genome
from evo.core.status import Status
from evo.llm.client import LLMSettings, make_llm
from evo.llm.mutate import Measurements, MutationRequest, child_genome, proposal_rows, proposal_template, propose_many
from evo.llm.replay import ReplayLLM
from evo.loop.pipeline import Session
from memory.llm import lesson_texts, recent_failures, recorded_calls
from memory.rows import Row


def make_session_llm(session: Session) -> Any:
    """The run's LLM client: off, live through litellm, or replaying a recorded run."""
    c = session.config.llm
    settings = LLMSettings.of(c)
    if c.replay_run:
        return ReplayLLM(recorded_calls(session.store, c.replay_run))
    return make_llm(settings, session.run_id)


def _lesson_lines(session: Session, kind: str | None, k: int) -> tuple[str, ...]:
    if k <= 0:
        return ()
    return lesson_texts(session.store, session.op.name, session.config.run.arch.rstrip("a"), kind, k)


def _recent_failures(session: Session, k: int) -> tuple[str, ...]:
    if k <= 0:
        return ()
    df = recent_failures(session.store, session.op.name, k)
    return tuple(f"{r.template} {r.params_json}: {r.status} {str(r.error or '')[:200]}" for r in df.itertuples())


def llm_children(session: Session, strategy: Any, llm: Any, best: dict, rng: random.Random,
                 ceiling: float) -> tuple[list[Genome], dict[str, str], list[Row]]:
    """New genomes from LLM-written templates, child key -> parent key, and the rows that record the
    calls and the new sources. The new templates join the session's and the strategy's."""
    c = session.config.llm
    if (c.model == "none" and not c.replay_run) or c.proposals_per_generation == 0 or not best:
        return [], {}, []
    by_label = {x.label(): x for x in session.cells}
    cells = sorted(best)
    rng.shuffle(cells)
    reqs = []
    for label in cells[: c.proposals_per_generation]:
        key, us, _ = best[label]
        parent = strategy.genome(key)
        if parent is None or parent.template not in session.templates:
            continue
        tdef = session.templates[parent.template]
        cell = by_label[label]
        bi = prepare(tdef, parent, session.config.run.arch, cell.dtypes_dict(), cell.dims_dict())
        gbps = session.op.bytes_moved(cell) / (us * 1e-6) / 1e9
        reqs.append(MutationRequest(
            parent=parent, template_text=tdef.text, rendered_source=bi.source,
            op_description=f"{session.op.name}: see ops/{session.op.name}/spec.py", arch=session.config.run.arch,
            measurements=Measurements(cell=label, time_us=us, pct_of_ceiling=100 * gbps / ceiling if ceiling else None),
            lessons=_lesson_lines(session, None, c.prompt_lessons), failures=_recent_failures(session, c.prompt_failures),
            dtypes=cell.dtypes_dict(), dims=cell.dims_dict()))
    if not reqs:
        return [], {}, []
    proposals = propose_many(llm, reqs, c.max_concurrency)
    children, parents, rows = [], {}, list(llm.take_rows())
    for p, req in zip(proposals, reqs):
        if p.status is not Status.OK:
            continue
        tdef = proposal_template(p)
        session.templates[tdef.name] = tdef
        strategy.add_template(tdef)
        g = child_genome(p)
        rows += proposal_rows(p, req)
        children.append(g)
        parents[g.key()] = req.parent.key()
    return children, parents, rows

"""Two more LLM roles: the failure analyst and the lesson writer.

Both return records; a failed call or a malformed answer is an LLM_ERROR record with the reason,
never an exception. `lesson_row` turns an accepted one into a lessons-table row with provenance.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd
from jinja2 import meta

from evo.llm.client import LLM
from evo.llm.prompts import render_prompt
from evo.templates.safety import expression_problems
from evo.templates.sandbox import sandbox_env
from evo.core.status import Status
from memory.lessons import lesson_id
from memory.rows import LessonRow, canonical_json

LLM_FAILURE = "llm_failure"  # lessons.kind of an analyst's rule
LLM_NOTE = "llm_note"  # lessons.kind of a lesson writer's text
MAX_LESSON_CHARS = 800
MAX_CONDITION_CHARS = 300
MAX_EXAMPLES = 8
LOG_LINES = 30
LOG_CHARS = 3000
# What a failure rule may predict: the statuses a candidate can fail with before or on the GPU.
PREDICTABLE = (
    Status.INVALID,
    Status.RENDER_ERROR,
    Status.COMPILE_ERROR,
    Status.RESOURCE_ERROR,
    Status.LAUNCH_ERROR,
    Status.CRASH,
    Status.TIMEOUT,
    Status.WRONG_ANSWER,
    Status.INPUT_MODIFIED,
)
_LESSON = re.compile(
    r"^\s*\**LESSON\**\s*:\s*(?P<text>.+?)(?=^\s*```|\n\s*\n|\Z)", re.IGNORECASE | re.DOTALL | re.MULTILINE
)
_FENCED = re.compile(r"^[ \t]*```[\w-]*[ \t]*\n(?P<body>.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class FailureExample:
    """One failed candidate of a cluster: what was built, how it failed, and what the tools said."""

    template: str
    params: Mapping[str, Any]
    status: Status
    error: str = ""
    log: str = ""


@dataclass(frozen=True)
class FailureLesson:
    """OK: a lesson text and a rule (condition over params -> predicted status); else LLM_ERROR."""

    status: Status
    text: str
    condition: str
    predicts: Status | None
    reason: str
    call_id: str


@dataclass(frozen=True)
class WrittenLesson:
    """OK: a short readable lesson from parameter-effect statistics; else LLM_ERROR."""

    status: Status
    text: str
    reason: str
    call_id: str


@dataclass(frozen=True)
class _Read:
    ok: bool
    text: str = ""
    condition: str = ""
    predicts: Status | None = None
    reason: str = ""


def excerpt(log: str, lines: int = LOG_LINES, chars: int = LOG_CHARS) -> str:
    """The head of a log, where compilers put the first error."""
    head = "\n".join(log.strip().splitlines()[:lines])
    return head[:chars]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _json_objects(answer: str) -> list[tuple[dict[str, Any], int, int]]:
    """JSON objects in the answer with their spans: fenced blocks first, else any bare {...}."""
    found: list[tuple[dict[str, Any], int, int]] = []
    for m in _FENCED.finditer(answer):
        try:
            obj = json.loads(m.group("body"))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append((obj, m.start(), m.end()))
    if found:
        return found
    dec = json.JSONDecoder()
    i = answer.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(answer, i)
        except json.JSONDecodeError:
            i = answer.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found.append((obj, i, end))
        i = answer.find("{", end)
    return found


def _lesson_text(answer: str, cut: Sequence[tuple[int, int]] = ()) -> str:
    """The text after 'LESSON:', else the prose left once code blocks and the cut spans are removed."""
    m = _LESSON.search(answer)
    if m:
        return _one_line(m.group("text"))
    for start, end in sorted(cut, reverse=True):
        answer = answer[:start] + answer[end:]
    return _one_line(_FENCED.sub("", answer))


def _allowed_name(name: str, params: set[str]) -> bool:
    return name in params or name == "arch" or name.endswith(("_bytes", "_dtype")) or name.isupper()


def read_failure_lesson(answer: str, param_names: Sequence[str]) -> _Read:
    """Parse a failure analyst's answer; pure."""
    objs = [(o, a, b) for o, a, b in _json_objects(answer) if "condition" in o or "predicts" in o]
    if not objs:
        return _Read(False, reason='no JSON object with "condition" and "predicts" in the answer')
    obj = objs[-1][0]
    text = _lesson_text(answer, [(a, b) for _, a, b in objs])
    cond, pred = obj.get("condition"), obj.get("predicts")
    if not isinstance(cond, str) or not cond.strip():
        return _Read(False, reason='"condition" must be a non-empty string')
    cond = cond.strip()
    if len(cond) > MAX_CONDITION_CHARS:
        return _Read(False, reason=f'"condition" is {len(cond)} characters (at most {MAX_CONDITION_CHARS})')
    bad = expression_problems([cond], what='"condition"')
    if bad:
        return _Read(False, reason="; ".join(bad))
    names = meta.find_undeclared_variables(sandbox_env().parse("{{ " + cond + " }}"))  # parses: checked above
    unknown = sorted(n for n in names if not _allowed_name(n, set(param_names)) and n not in sandbox_env().globals)
    if unknown:
        return _Read(False, reason=f'"condition" reads unknown names {unknown} (params: {sorted(param_names)})')
    names_ok = {s.name for s in PREDICTABLE}
    if not isinstance(pred, str) or pred.strip().upper() not in names_ok:
        return _Read(False, reason=f'"predicts" must be one of {sorted(names_ok)}, got {pred!r}')
    if not text:
        return _Read(False, reason="no lesson text (expected a line starting with 'LESSON:')")
    if len(text) > MAX_LESSON_CHARS:
        return _Read(False, reason=f"lesson text is {len(text)} characters (at most {MAX_LESSON_CHARS})")
    return _Read(True, text=text, condition=cond, predicts=Status[pred.strip().upper()])


def read_written_lesson(answer: str, params: Sequence[str]) -> _Read:
    """Parse a lesson writer's answer; pure. It must name at least one of the parameters."""
    if "```" in answer:
        return _Read(False, reason="the lesson must be plain text, the answer holds a code block")
    text = _lesson_text(answer)
    if not text:
        return _Read(False, reason="no lesson text (expected a line starting with 'LESSON:')")
    if len(text) > MAX_LESSON_CHARS:
        return _Read(False, reason=f"lesson text is {len(text)} characters (at most {MAX_LESSON_CHARS})")
    if params and not any(re.search(rf"\b{re.escape(p)}\b", text) for p in params):
        return _Read(False, reason=f"the lesson names none of the parameters {sorted(params)}")
    return _Read(True, text=text)


def _failure_context(op: str, arch: str, failures: Sequence[FailureExample], template_text: str) -> dict[str, Any]:
    shown = list(failures)[:MAX_EXAMPLES]
    params = sorted({k for f in shown for k in f.params})
    return dict(
        op=op,
        arch=arch,
        failures=[
            dict(
                template=f.template,
                status=Status(f.status).name,
                params=", ".join(f"{k}={v!r}" for k, v in sorted(f.params.items())),
                error=_one_line(f.error)[:500],
                log=excerpt(f.log),
            )
            for f in shown
        ],
        template_text=template_text.rstrip("\n"),
        param_names=", ".join(params) or "(none)",
        statuses=", ".join(s.name for s in PREDICTABLE),
    )


def analyze_failures(
    llm: LLM, op: str, arch: str, failures: Sequence[FailureExample], template_text: str = ""
) -> FailureLesson:
    """Ask the failure analyst for the common cause of a cluster of failures."""
    if not failures:
        return FailureLesson(Status.LLM_ERROR, "", "", None, "no failures to analyze", "")
    prompt = render_prompt("failure_analyst", **_failure_context(op, arch, failures, template_text))
    reply = llm.complete(prompt)
    if not reply.status.ok or reply.text is None:
        return FailureLesson(Status.LLM_ERROR, "", "", None, reply.error, reply.call_id)
    r = read_failure_lesson(reply.text, sorted({k for f in failures for k in f.params}))
    status = Status.OK if r.ok else Status.LLM_ERROR
    llm.record_outcome(reply.call_id, status, r.reason)
    return FailureLesson(status, r.text, r.condition, r.predicts, r.reason, reply.call_id)


def _stats_table(stats: Sequence[Mapping[str, Any]] | pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    rows = stats.to_dict("records") if isinstance(stats, pd.DataFrame) else [dict(r) for r in stats]
    columns = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    return columns, [[cell(r.get(c)) for c in columns] for r in rows]


def write_lesson(
    llm: LLM, op: str, arch: str, stats: Sequence[Mapping[str, Any]] | pd.DataFrame, scope: str = ""
) -> WrittenLesson:
    """Ask the lesson writer to turn parameter-effect statistics into a short readable lesson.

    stats: one row per (param, value) with whatever statistics the caller has (e.g. n, mean speedup,
    failure rate); a 'param' column, if present, names the parameters the lesson must mention.
    """
    columns, rows = _stats_table(stats)
    if not rows:
        return WrittenLesson(Status.LLM_ERROR, "", "no statistics to write a lesson from", "")
    prompt = render_prompt("lesson_writer", op=op, arch=arch, scope=scope, columns=columns, rows=rows)
    reply = llm.complete(prompt)
    if not reply.status.ok or reply.text is None:
        return WrittenLesson(Status.LLM_ERROR, "", reply.error, reply.call_id)
    params = sorted({r[columns.index("param")] for r in rows}) if "param" in columns else []
    r = read_written_lesson(reply.text, params)
    status = Status.OK if r.ok else Status.LLM_ERROR
    llm.record_outcome(reply.call_id, status, r.reason)
    return WrittenLesson(status, r.text, r.reason, reply.call_id)


def lesson_row(
    lesson: FailureLesson | WrittenLesson,
    *,
    op: str,
    arch: str,
    run_id: str,
    scope: Mapping[str, Any],
    support: int = 0,
    provenance: Mapping[str, Any] | None = None,
) -> LessonRow:
    """A lessons-table row for an accepted lesson, with the call that wrote it as provenance.

    The id hashes kind and scope (memory.lessons' rule), so a later analysis of the same scope
    updates the row instead of adding one. Kinds are their own ('llm_failure': structured condition
    is a Jinja expression, unlike the statistical 'failure' rules' param=value dicts; 'llm_note').
    """
    if not lesson.status.ok:
        raise ValueError(f"lesson from call {lesson.call_id} was not accepted: {lesson.reason}")
    if isinstance(lesson, FailureLesson):
        kind = LLM_FAILURE
        structured = {"condition": lesson.condition, "predicts": lesson.predicts.name if lesson.predicts else None}
    else:
        kind, structured = LLM_NOTE, {}
    role = "failure_analyst" if kind == LLM_FAILURE else "lesson_writer"
    return LessonRow(
        lesson_id=lesson_id(kind, op, arch, scope),
        kind=kind,
        op=op,
        arch=arch,
        scope_json=canonical_json(dict(scope)),
        text=lesson.text,
        structured_json=canonical_json(structured),
        provenance_json=canonical_json({"llm_call_id": lesson.call_id, "role": role, **dict(provenance or {})}),
        created_run=run_id,
        support=int(support),
    )

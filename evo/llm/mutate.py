"""The LLM mutation operator: ask a model for a new template variant of a parent genome.

The answer is a whole template or SEARCH/REPLACE edits to the parent's template text (evo.llm.edits).
It becomes a proposal only if it applies, passes the safety checks, parses as a template of the same
op and changes something; anything else is an LLM_ERROR proposal with the reason. An accepted
template is renamed `<parent base name>~<6 hex of its hash>`, so every variant is a distinct template
and genome; its source rows (content-addressed, with lineage) come from `proposal_rows`.
"""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from evo.core.genome import Genome
from evo.llm.client import LLM
from evo.llm.edits import EditError, new_template_text
from evo.llm.prompts import Prompt, render_prompt, sha256
from evo.templates.safety import cuda_problems, declaration_problems, template_problems
from evo.templates.render import render
from evo.core.status import Status
from evo.templates.template import HEADER, TemplateDef, TemplateError, parse_template
from memory.rows import SourceRow

ROLE = "mutate"
MAX_TEMPLATE_CHARS = 100_000
NAME_SEP = "~"
_NAME_LINE = re.compile(r"^(?P<lead>\s*name\s*=\s*)(?P<q>[\"'])(?P<v>.*?)(?P=q)(?P<rest>.*)$")
_SECTION = re.compile(r"^\s*\[+\s*(?P<s>[A-Za-z0-9_.-]+)\s*\]+")


@dataclass(frozen=True)
class Measurements:
    """The parent's latest numbers on one cell; None where unknown."""

    cell: str = ""
    time_us: float | None = None
    pct_of_ceiling: float | None = None
    regs: int | None = None
    spills: int | None = None

    def lines(self) -> list[str]:
        out = []
        if self.time_us is not None:
            out.append(f"median time: {self.time_us:.2f} us")
        if self.pct_of_ceiling is not None:
            out.append(f"bandwidth: {self.pct_of_ceiling:.1f}% of the device-to-device copy ceiling")
        if self.regs is not None:
            out.append(f"registers per thread: {self.regs}")
        if self.spills is not None:
            out.append(f"spill bytes (stores + loads): {self.spills}")
        return out


@dataclass(frozen=True)
class MutationRequest:
    """Everything the operator sends about one parent.

    dtypes/dims: the cell the parent was rendered for; when given, the new template's defaults are
    rendered for it and the CUDA is checked too. variant: the k-th request for the same parent in a
    batch (propose_many sets it); it is part of the prompt, so repeated requests differ.
    """

    parent: Genome
    template_text: str
    rendered_source: str
    op_description: str
    arch: str = "sm_90a"
    measurements: Measurements = Measurements()
    lessons: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()
    dtypes: Mapping[str, str] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    variant: int = 0

    @property
    def op(self) -> str:
        return self.parent.op


@dataclass(frozen=True)
class LLMProposal:
    """OK with the new (renamed) template text, or LLM_ERROR with the reason."""

    status: Status
    template_text: str | None
    reason: str
    call_id: str


def mutation_prompt(req: MutationRequest) -> Prompt:
    """The rendered mutate.j2 prompt for one request."""
    return render_prompt(
        ROLE,
        op=req.op,
        op_description=req.op_description.strip(),
        arch=req.arch,
        template_name=req.parent.template,
        params=", ".join(f"{k}={v!r}" for k, v in req.parent.params) or "(none)",
        cell=req.measurements.cell,
        measurements=req.measurements.lines(),
        template_text=req.template_text.rstrip("\n"),
        rendered_source=req.rendered_source.strip("\n"),
        dtypes=", ".join(f"{k}={v}" for k, v in sorted(req.dtypes.items())),
        lessons=list(req.lessons),
        failures=list(req.failures),
        variant=req.variant,
    )


def base_name(template: str) -> str:
    """A template name without any LLM suffix: 'warp_row~ab12cd' -> 'warp_row'."""
    return template.split(NAME_SEP, 1)[0]


def child_name(parent_template: str, text: str) -> str:
    """The parent's base name plus 6 hex digits of the new text's hash."""
    return f"{base_name(parent_template)}{NAME_SEP}{sha256(text)[:6]}"


def rename_template(text: str, name: str) -> str:
    """text with [template].name in its header set to name."""
    m = HEADER.match(text)
    if not m:
        raise TemplateError("no kfactory header to rename")
    lines = m.group("toml").split("\n")
    section = ""
    for i, line in enumerate(lines):
        if sm := _SECTION.match(line):
            section = sm.group("s")
        elif section == "template" and (nm := _NAME_LINE.match(line)):
            lines[i] = f'{nm.group("lead")}"{name}"{nm.group("rest")}'
            start, end = m.span("toml")
            return text[:start] + "\n".join(lines) + text[end:]
    raise TemplateError("[template].name is not a plain `name = \"...\"` line, cannot rename")


def _same_code(a: str, b: str) -> bool:
    """Equal up to [template].name and whitespace: such a 'variant' would only re-measure its parent."""
    return " ".join(rename_template(a, "_").split()) == " ".join(rename_template(b, "_").split())


def _render_problems(tdef: TemplateDef, req: MutationRequest) -> list[str]:
    """CUDA checks on the defaults rendered for the parent's cell (Jinja can build text the static checks miss).

    A template that does not render here is left to the build, which records RENDER_ERROR.
    """
    if not req.dtypes:
        return []
    arch = int(re.sub(r"\D", "", req.arch))
    try:
        consts = tdef.consts(dict(req.dims))
    except KeyError:  # a specialized dim the cell lacks and the op gives no default for
        return []
    r = render(tdef, tdef.default_params(), arch, dict(req.dtypes), consts)
    return cuda_problems(r.source) if r.status.ok else []


def _expression_problems(tdef: TemplateDef, req: MutationRequest) -> list[str]:
    """Header expressions that fail (raise, or go over the sandbox's limits) at the defaults on the parent's cell.

    A template whose constraint cannot be evaluated would stop the run the first time it is sampled."""
    arch = int(re.sub(r"\D", "", req.arch))
    try:
        legal = not tdef.violations(tdef.default_params(), arch, dict(req.dtypes), dict(req.dims) or None)
        if legal and req.dtypes and req.dims:
            tdef.plan(tdef.default_params(), arch, dict(req.dtypes), dict(req.dims))
    except TemplateError as e:
        return [str(e)]
    return []


def read_proposal(answer: str, req: MutationRequest) -> tuple[Status, str | None, str]:
    """Judge an answer: (OK, renamed template text, '') or (LLM_ERROR, None, reason). Pure."""

    def no(reason: str) -> tuple[Status, str | None, str]:
        return Status.LLM_ERROR, None, reason

    try:
        text = new_template_text(answer, req.template_text)
    except EditError as e:
        return no(str(e))
    if len(text) > MAX_TEMPLATE_CHARS:
        return no(f"template is {len(text)} characters (at most {MAX_TEMPLATE_CHARS})")
    problems = template_problems(text)
    if problems:
        return no("unsafe template: " + "; ".join(problems))
    try:
        tdef = parse_template(text, "llm answer")
    except TemplateError as e:
        return no(f"not a valid template: {e}")
    if tdef.op != req.op:
        return no(f"template declares op {tdef.op!r}, the parent's op is {req.op!r}")
    problems = declaration_problems(tdef)
    if problems:
        return no("unsafe template: " + "; ".join(problems))
    problems = _expression_problems(tdef, req)
    if problems:
        return no("a header expression fails: " + "; ".join(problems))
    try:
        if _same_code(text, req.template_text):
            return no("the answer does not change the parent template (beyond its name or whitespace)")
        final = rename_template(text, child_name(req.parent.template, text))
        tdef = parse_template(final, "llm answer")
    except TemplateError as e:
        return no(f"not a valid template: {e}")
    problems = _render_problems(tdef, req)
    if problems:
        return no("unsafe rendered CUDA: " + "; ".join(problems))
    return Status.OK, final, ""


def propose_one(llm: LLM, req: MutationRequest) -> LLMProposal:
    """Ask for one variant of req.parent; a failure of any kind is an LLM_ERROR proposal."""
    reply = llm.complete(mutation_prompt(req))
    if not reply.status.ok or reply.text is None:
        return LLMProposal(Status.LLM_ERROR, None, reply.error, reply.call_id)
    status, text, reason = read_proposal(reply.text, req)
    llm.record_outcome(reply.call_id, status, reason)
    return LLMProposal(status, text, reason, reply.call_id)


def propose_many(llm: LLM, requests: Sequence[MutationRequest], max_concurrency: int = 4) -> list[LLMProposal]:
    """One proposal per request, in order, at most max_concurrency in flight; [] when the LLM is off.

    Repeated requests for the same parent are numbered (variant 0, 1, ...) so their prompts differ.
    """
    if not llm.enabled or not requests:
        return []
    seen: dict[tuple[str, str], int] = {}
    numbered = []
    for r in requests:
        k = (r.parent.key(), sha256(r.template_text))
        numbered.append(dataclasses.replace(r, variant=r.variant + seen.get(k, 0)))
        seen[k] = seen.get(k, 0) + 1
    with ThreadPoolExecutor(max_workers=max(1, min(max_concurrency, len(numbered)))) as pool:
        return list(pool.map(lambda r: propose_one(llm, r), numbered))


def proposal_template(p: LLMProposal) -> TemplateDef:
    """The accepted proposal's template."""
    if not p.status.ok or p.template_text is None:
        raise ValueError(f"proposal {p.call_id} was not accepted: {p.reason}")
    return parse_template(p.template_text, f"llm call {p.call_id}")


def child_genome(p: LLMProposal) -> Genome:
    """The genome to evaluate first: the new template at its declared defaults, text attached."""
    t = proposal_template(p)
    return Genome.make(t.op, t.name, t.source_hash, t.default_params(), text=t.text)


def proposal_rows(p: LLMProposal, req: MutationRequest) -> list[SourceRow]:
    """Source rows to write for a proposal: the new text with its lineage ([] if it was refused)."""
    if not p.status.ok or p.template_text is None:
        return []
    t = proposal_template(p)
    return [
        SourceRow.of(
            p.template_text,
            op=t.op,
            template=t.name,
            origin="llm",
            parent_hash=req.parent.source_hash,
            llm_call_id=p.call_id,
        )
    ]


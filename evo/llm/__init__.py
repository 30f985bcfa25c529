"""The LLM operator and roles: prompts, clients (litellm, disabled, replay), answer parsing, safety."""

from evo.llm.client import LLM, DisabledLLM, LiteLLM, LLMReply, LLMSettings, make_llm
from evo.llm.mutate import (
    LLMProposal,
    Measurements,
    MutationRequest,
    child_genome,
    proposal_rows,
    proposal_template,
    propose_many,
    propose_one,
)
from evo.llm.prompts import Prompt, render_prompt
from evo.llm.replay import ReplayLLM
from evo.llm.roles import (
    FailureExample,
    FailureLesson,
    WrittenLesson,
    analyze_failures,
    lesson_row,
    write_lesson,
)
from evo.llm.secrets import redact

__all__ = [
    "LLM",
    "DisabledLLM",
    "FailureExample",
    "FailureLesson",
    "LLMProposal",
    "LLMReply",
    "LLMSettings",
    "LiteLLM",
    "Measurements",
    "MutationRequest",
    "Prompt",
    "ReplayLLM",
    "WrittenLesson",
    "analyze_failures",
    "child_genome",
    "lesson_row",
    "make_llm",
    "propose_many",
    "propose_one",
    "proposal_rows",
    "proposal_template",
    "redact",
    "render_prompt",
    "write_lesson",
]

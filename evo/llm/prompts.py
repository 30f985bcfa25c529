"""Prompts are Jinja files under templates/prompts/, rendered in the project sandbox.

A rendered prompt carries two hashes: of the prompt template's source (which wording asked) and of
the rendered text (what exactly was asked; replay answers by it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from evo.llm.secrets import redact
from evo.templates.sandbox import sandbox_env


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt for one role ('mutate', 'failure_analyst', 'lesson_writer')."""

    role: str
    text: str
    template_hash: str

    @property
    def hash(self) -> str:
        return sha256(self.text)


def prompt_template_source(role: str) -> str:
    """The source text of templates/prompts/<role>.j2."""
    env = sandbox_env()
    source, _, _ = env.loader.get_source(env, f"prompts/{role}.j2")
    return source


def render_prompt(role: str, **context: Any) -> Prompt:
    """templates/prompts/<role>.j2 rendered with context (plain strings, numbers and lists).

    Environment secrets that reached the context (say, in a log excerpt) are masked: a prompt leaves
    the machine and is stored.
    """
    text = sandbox_env().get_template(f"prompts/{role}.j2").render(**context)
    return Prompt(role, redact(text.strip()) + "\n", sha256(prompt_template_source(role)))

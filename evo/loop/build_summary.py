"""A run's builds summed up per template: what a run prints at its end (counts by status, the first errors
verbatim), so that a failing template is not left silent in the store's builds table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from evo.build.nvrtc import BuildResult
from evo.core.status import Status
from memory.queries import counts_text

SHOWN_PER_TEMPLATE = 2  # distinct error messages quoted for each template
SHOWN_TEMPLATES = 12  # templates listed one line each (those with errors first); the rest in one line
_BUILDS = "; builds: "  # in a built-only run's stored message: what it says, then its builds' headline


class NothingBuiltError(RuntimeError):
    """No build of a run came out OK: every candidate failed to render, compile or fit its target."""


def _counts(statuses: Iterable[Status]) -> str:
    """'3 OK, 1 COMPILE_ERROR': the words the report uses (memory.queries.counts_text)."""
    return counts_text(Counter(s.value for s in statuses))


@dataclass(frozen=True)
class BuildSummary:
    """A run's distinct builds with their template and status, and each template's first distinct errors."""

    builds: Mapping[str, tuple[str, Status]] = field(default_factory=dict)  # build key -> (template, status)
    errors: Mapping[str, tuple[tuple[Status, str], ...]] = field(default_factory=dict)  # template -> first errors
    first_built: int | None = None  # of the builds, how many the run recorded first (None: not counted)

    def add(self, results: Sequence[tuple[str, BuildResult]]) -> "BuildSummary":
        """This summary and more (template, build result) pairs (a build key seen before is counted once)."""
        builds = dict(self.builds)
        errors = {t: list(e) for t, e in self.errors.items()}
        for template, r in results:
            if r.build_key in builds:
                continue
            builds[r.build_key] = (template, r.status)
            quoted = errors.setdefault(template, [])
            if r.status is not Status.OK and len(quoted) < SHOWN_PER_TEMPLATE and r.error not in {m for _, m in quoted}:
                quoted.append((r.status, r.error))
        return BuildSummary(builds, {t: tuple(e) for t, e in errors.items() if e}, self.first_built)

    @property
    def ok(self) -> int:
        return sum(s is Status.OK for _, s in self.builds.values())

    def counts(self, template: str | None = None) -> str:
        """The builds by status ('3 OK, 1 COMPILE_ERROR'), of one template or of all."""
        return _counts(s for t, s in self.builds.values() if template in (None, t))

    def headline(self) -> str:
        """'10 distinct: 9 OK, 1 COMPILE_ERROR (3 compiled in this run, 7 reused from the store)'."""
        text = f"{len(self.builds)} distinct: {self.counts()}"
        if self.first_built is None:
            return text
        return f"{text} ({self.first_built} compiled in this run, {len(self.builds) - self.first_built} reused " \
               "from the store)"

    def lines(self) -> list[str]:
        """The console summary: the counts, then per template its counts and its first errors verbatim."""
        if not self.builds:
            return ["builds: none (no candidate was legal on any cell, or failure memory rejected every one)"]
        templates = list(dict.fromkeys(t for t, _ in self.builds.values()))
        templates.sort(key=lambda t: t not in self.errors)  # stable: failing templates first, in order of appearance
        out = [f"builds: {self.headline()}"]
        for t in templates[:SHOWN_TEMPLATES]:
            out.append(f"  template {t}: {self.counts(t)}")
            out += [f"    {s.value}: {msg or '(no message)'}" for s, msg in self.errors.get(t, ())]
        if len(templates) > SHOWN_TEMPLATES:
            rest = set(templates[SHOWN_TEMPLATES:])
            out.append(f"  ... {len(rest)} more templates: {_counts(s for t, s in self.builds.values() if t in rest)}")
        return out

    def check(self) -> None:
        """NothingBuiltError (one line) when no build came out OK; call it once everything is recorded."""
        if self.ok:
            return
        if not self.errors:
            raise NothingBuiltError("nothing was built: no candidate was legal on any cell of the run (or failure "
                                    "memory rejected every one)")
        t, ((s, msg), *_) = next(iter(self.errors.items()))
        raise NothingBuiltError(f"none of the run's {len(self.builds)} distinct builds came out OK "
                                f"({self.counts()}); the first error, {s.value} in template {t}: "
                                f"{msg or '(no message)'} (every build is in the store's builds table)")


def built_only_message(what: str, summary: BuildSummary) -> str:
    """The stored message of a run that built and evaluated nothing: what it was, then its builds' headline (the
    store keeps a build once, under the run that built it first, so a later run's builds live only here)."""
    return f"{what}{_BUILDS}{summary.headline()}"


def split_built_only(message: str) -> tuple[str, str]:
    """(what the run was, its builds' headline) of a built_only_message; (message, '') for any other message."""
    what, _, builds = message.partition(_BUILDS)
    return what, builds

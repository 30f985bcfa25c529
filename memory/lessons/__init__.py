"""Lessons re-derived from every evaluation in the store: parameter effects, failure rules, champions.

Pure functions turn the DataFrames of memory.queries into LessonRows; `refresh_lessons` reads,
derives and upserts them, after a generation or at the end of a run. A lesson's id hashes its kind
and scope, so deriving it again updates the same row (its usefulness is kept). Every lesson carries
provenance that re-selects the rows behind its number.

Credit: `record_uses` makes LessonUseRows when the search applies a lesson; `update_usefulness`
re-scores the lessons a run used from how the genomes they influenced did.
"""

from memory.lessons.champions import champion_lessons, rank_genomes
from memory.lessons.credit import (
    PRIOR_USES,
    SCORE_FAILED,
    SCORE_GOOD,
    SCORE_SLOW,
    Use,
    outcome_scores,
    record_uses,
    update_usefulness,
    usefulness_scores,
)
from memory.lessons.effects import param_effect_lessons, template_effect_lessons
from memory.lessons.extract import extract_lessons, refresh_lessons, write_lessons
from memory.lessons.failures import MAX_PROVENANCE_IDS, best_condition, failure_lessons
from memory.lessons.ids import lesson_id
from memory.lessons.relative import effect_of, genome_rel, template_rel, with_cells
from memory.lessons.signatures import MAX_SIGNATURE_CHARS, normalize_error, signature
from memory.lessons.stats import Z95, params_text, wilson_lower

__all__ = [
    "MAX_PROVENANCE_IDS",
    "MAX_SIGNATURE_CHARS",
    "PRIOR_USES",
    "SCORE_FAILED",
    "SCORE_GOOD",
    "SCORE_SLOW",
    "Z95",
    "Use",
    "best_condition",
    "champion_lessons",
    "effect_of",
    "extract_lessons",
    "failure_lessons",
    "genome_rel",
    "lesson_id",
    "normalize_error",
    "outcome_scores",
    "param_effect_lessons",
    "template_effect_lessons",
    "template_rel",
    "params_text",
    "rank_genomes",
    "record_uses",
    "refresh_lessons",
    "signature",
    "update_usefulness",
    "usefulness_scores",
    "wilson_lower",
    "with_cells",
    "write_lessons",
]

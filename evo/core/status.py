"""The one Status enum for every outcome of a candidate."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """Why a candidate failed, or OK. Stored by name in the `status` columns."""

    OK = "OK"
    INVALID = "INVALID"  # outside its template's declared space (never built)
    RENDER_ERROR = "RENDER_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    RESOURCE_ERROR = "RESOURCE_ERROR"  # compiled, but exceeds registers/smem/threads of the target
    LAUNCH_ERROR = "LAUNCH_ERROR"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    WRONG_ANSWER = "WRONG_ANSWER"
    INPUT_MODIFIED = "INPUT_MODIFIED"  # a launch wrote one of its inputs
    SUSPECT = "SUSPECT"  # passed every check, but its time implies more than the copy ceiling: never ranked
    LLM_ERROR = "LLM_ERROR"
    REJECTED = "REJECTED"  # predicted to fail by a lesson, never built or run
    UNKNOWN = "UNKNOWN"  # replay has no recorded measurement

    @property
    def ok(self) -> bool:
        return self is Status.OK

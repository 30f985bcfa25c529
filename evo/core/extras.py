"""Optional dependencies (pyproject's extras): what a config needs beyond the base install, said before a run
starts, and a guarded import for the code that uses them."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from evo.core.config import Backend, Config


class MissingExtraError(ImportError):
    """A feature's optional dependency is not installed; the message names the extra that installs it."""


def _message(module: str, extra: str, feature: str) -> str:
    return (f"{feature} needs {module}, which is not installed: install the {extra!r} extra "
            f"(pip install -e '.[{extra}]' in the checkout)")


def require(module: str, extra: str, feature: str) -> ModuleType:
    """The module, imported; MissingExtraError naming its extra where it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(_message(module, extra, feature)) from e


def needed(config: Config) -> list[tuple[str, str, str]]:
    """(module, extra, the setting that needs it) for each optional dependency the config uses."""
    out = []
    if config.llm.enabled and not config.llm.replay_run:  # a replayed LLM answers from the store
        out.append(("litellm", "llm", f"llm.model = {config.llm.model!r}"))
    if config.run.backend is Backend.RAY:
        out.append(("ray", "ray", "run.backend = 'ray'"))
    return out


def check_extras(config: Config) -> None:
    """MissingExtraError for the first optional dependency the config needs and this environment lacks."""
    for module, extra, feature in needed(config):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(_message(module, extra, feature))

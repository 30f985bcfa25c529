"""An op folder being added (ops/<op>/) that is not an op yet: get_op says what it lacks, in one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import ops
from evo.core import registry
from evo.core.registry import UnknownOpError, get_op


@pytest.fixture
def scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder ops/scale/ in a stand-in ops folder (the real one is left alone), importable as ops.scale."""
    folder = tmp_path / "scale"
    folder.mkdir()
    monkeypatch.setattr(registry, "ROOT", tmp_path)
    monkeypatch.setattr(ops, "__path__", [*ops.__path__, str(tmp_path)])
    yield folder
    sys.modules.pop("ops.scale", None)
    ops.__dict__.pop("scale", None)


def test_a_folder_without_init_says_so(scale: Path) -> None:
    with pytest.raises(UnknownOpError) as e:
        get_op("scale")
    assert str(e.value).startswith("unknown op 'scale': ops/scale/ has no __init__.py; it must expose SPEC (an "
                                   "OpSpec), e.g. `from ops.scale.spec import SPEC`; known ops: ")


@pytest.mark.parametrize("init, has", [("", "no SPEC"), ("SPEC = {'name': 'scale'}\n", "a SPEC of type dict")],
                         ids=["no-spec", "not-an-opspec"])
def test_an_init_without_an_opspec_says_so(scale: Path, monkeypatch: pytest.MonkeyPatch, init: str,
                                           has: str) -> None:
    (scale / "__init__.py").write_text(init)
    monkeypatch.setattr(registry, "KNOWN", (*registry.KNOWN, "scale"))  # discovered, as a package with __init__.py is
    with pytest.raises(UnknownOpError) as e:
        get_op("scale")
    msg = str(e.value)
    assert msg.startswith(f"unknown op 'scale': ops/scale/__init__.py has {has}; it must expose SPEC (an OpSpec), "
                          "e.g. `from ops.scale.spec import SPEC`; ")
    assert "known ops: " in msg and "scale" not in msg.split("known ops: ")[1]


def test_a_name_with_no_folder_keeps_the_plain_error() -> None:
    with pytest.raises(UnknownOpError) as e:
        get_op("nope")
    assert str(e.value).startswith("unknown op 'nope'; known ops: ") and "rmsnorm" in str(e.value)

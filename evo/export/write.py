"""The exported package on disk: pyproject, README, the runtime modules, its tests, and data/.

    OUT/pyproject.toml, README.md
    OUT/tests/conftest.py, test_launch.py           every family's (evo/export/runtime/tests)
    OUT/tests/test_cpu.py, test_gpu.py              the family's
    OUT/NAME/*.py                                   the runtime: evo/export/runtime/package (generic) and the
                                                    op family's RUNTIME/package (its API, custom ops, fallback)
    OUT/NAME/data/dispatch.json, provenance.json
    OUT/NAME/data/results/OP_evaluations.csv        every evaluation the run recorded
    OUT/NAME/data/templates/OP/T.HASH.cu.j2, _macros/...   templates as the run used them
    OUT/NAME/data/kernels/OP/ID.cu, ID.ARCH.cubin   one per distinct build of the table
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import meta

from evo.export.document import kernel_files, template_file
from evo.export.errors import ExportError
from evo.export.family import Family
from evo.export.kernels import Kernel
from evo.export.runs import RunTable
from evo.templates.sandbox import TEMPLATES_ROOT, sandbox_env

RUNTIME = Path(__file__).with_name("runtime")
TOKEN = "kf_pkg"  # the package's name in the runtime's tests, replaced by the export's
TESTS = (("conftest.py", "conftest.py"), ("launch_tests.py", "test_launch.py"), ("cpu_tests.py", "test_cpu.py"),
         ("gpu_tests.py", "test_gpu.py"))

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
description = {description}
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["torch>=2.4", "numpy", "jinja2>=3.1", "cuda-core>=0.4", "cuda-bindings>=12.8", "cuda-pathfinder>=1.0"]

[project.optional-dependencies]
# NVRTC and CUDA headers, for shapes and GPUs the prebuilt cubins do not cover
nvrtc = ["cuda-toolkit[nvrtc,cudart,cccl]>=12.8"]
test = ["pytest>=7"]

[tool.setuptools.packages.find]
include = ["{name}", "{name}.*"]  # data/ folders are found as namespace packages, so their files ship

[tool.setuptools.package-data]
"*" = ["*.json", "*.csv", "*.j2", "*.cu", "*.cubin"]
"""


def includes(text: str) -> list[str]:
    """Template files `text` includes or imports, transitively (paths under templates/)."""
    out: list[str] = []
    todo = [text]
    while todo:
        for ref in meta.find_referenced_templates(sandbox_env().parse(todo.pop())):
            if ref is None:
                raise ValueError("a template includes a computed name; the export cannot tell which file")
            if ref not in out:
                out.append(ref)
                todo.append((TEMPLATES_ROOT / ref).read_text())
    return out


def _json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")


def runtime_files(folder: str, family: Family) -> dict[str, Path]:
    """The files of the generic runtime's `folder` and the family's, by name; a name in both is an error."""
    files: dict[str, Path] = {}
    for root in (RUNTIME, family.runtime):
        for p in sorted((root / folder).iterdir()):
            if p.name == "__pycache__" or p.suffix == ".pyc":
                continue
            if p.name in files:
                raise ExportError(f"{family.module}: {folder}/{p.name} is also a file of the generic runtime "
                                  f"({RUNTIME / folder}); give it another name")
            files[p.name] = p
    return files


def write_package(out: Path, name: str, version: str, family: Family, runs: Sequence[RunTable],
                  kernels: dict[str, Sequence[Kernel]], dispatch: dict[str, Any], provenance: dict[str, Any],
                  readme: str) -> None:
    """Every file of the package under `out` (an empty or new folder)."""
    pkg = out / name
    pkg.mkdir()
    for fname, src in runtime_files("package", family).items():
        shutil.copyfile(src, pkg / fname)
    tests = runtime_files("tests", family)
    if sorted(tests) != sorted(src for src, _ in TESTS):
        raise ExportError(f"{family.module}: the runtime's tests are {', '.join(sorted(tests))}; want "
                          f"{', '.join(src for src, _ in TESTS)} (conftest.py and launch_tests.py are the engine's)")
    (out / "tests").mkdir()
    for src, dst in TESTS:
        (out / "tests" / dst).write_text(tests[src].read_text().replace(TOKEN, name))
    data = pkg / "data"
    for run in runs:
        for k in kernels[run.op]:
            cu, cubin = kernel_files(run.op, k, run.arch)
            (data / cu).parent.mkdir(parents=True, exist_ok=True)
            (data / cu).write_text(k.source)
            (data / cubin).write_bytes(k.cubin)
            tfile = data / template_file(run.op, k.template)
            tfile.parent.mkdir(parents=True, exist_ok=True)
            tfile.write_text(k.template.text)
            for ref in includes(k.template.text):
                (data / "templates" / ref).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(TEMPLATES_ROOT / ref, data / "templates" / ref)
        (data / "results").mkdir(parents=True, exist_ok=True)
        run.evaluations.to_csv(data / "results" / f"{run.op}_evaluations.csv", index=False)
    _json(data / "dispatch.json", dispatch)
    _json(data / "provenance.json", provenance)
    description = family.description.format(runs=", ".join(i for r in runs for i in r.run_ids))
    (out / "pyproject.toml").write_text(PYPROJECT.format(dist=name.replace("_", "-"), name=name, version=version,
                                                         description=json.dumps(description)))
    (out / "README.md").write_text(readme)

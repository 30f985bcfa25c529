"""One-off: move evo/'s flat modules into stage packages and rewrite every reference (issue 13).

Run from the project root on a clean tree: python experiments/scripts/restructure.py
It `git mv`s the files, rewrites module names in .py/.toml/.md/.ipynb/.cfg files (imports, monkeypatch
strings, `python -m`), fixes the two paths computed from __file__, and writes the package __init__s.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# old module -> new module
MOVES = {
    "evo.genome": "evo.core.genome",
    "evo.status": "evo.core.status",
    "evo.config": "evo.core.config",
    "evo.children": "evo.core.children",
    "evo.llm_settings": "evo.core.llm_settings",
    "evo.template": "evo.templates.template",
    "evo.sandbox": "evo.templates.sandbox",
    "evo.render": "evo.templates.render",
    "evo.build": "evo.build.nvrtc",
    "evo.space": "evo.search.space",
    "evo.operators": "evo.search.operators",
    "evo.strategy": "evo.search.strategy",
    "evo.deap_adapter": "evo.search.deap_adapter",
    "evo.jobs": "evo.measure.jobs",
    "evo.gate": "evo.measure.gate",
    "evo.worker": "evo.measure.worker",
    "evo.run": "evo.measure.run",
    "evo.verify": "evo.measure.verify",
    "evo.evaluate": "evo.measure.evaluate",
    "evo.evaluators": "evo.measure.evaluators",
    "evo.ray_backend": "evo.measure.ray_backend",
    "evo.pipeline": "evo.loop.pipeline",
    "evo.search": "evo.loop.search",
    "evo.learn": "evo.loop.learn",
    "evo.llm_step": "evo.loop.llm_step",
    "evo.cli": "evo.cli.main",
    "evo.commands": "evo.cli.commands",
    "evo.report": "evo.cli.report",
    "evo.bench": "evo.cli.bench",
}
PACKAGES = {
    "core": "Records and settings every stage shares: the genome, the Status enum, the experiment config, child processes.",
    "templates": "Templates: the TOML header (space, constraints, launch plan), the Jinja sandbox, rendering.",
    "build": "Build: NVRTC compiles in killable child processes, the ptxas report, the build cache.",
    "search": "Search: parameter spaces, pure mutation operators, strategies (GA through DEAP, random).",
    "measure": "Measure: the gate, the GPU worker and its watchdog, verdicts, evaluators (GPU, replay, Ray).",
    "loop": "The loop: a run's session, propose -> screen -> build -> measure -> record -> learn.",
    "cli": "The kfactory command line: run, resume, report, sql, lessons, bench.",
}
SUFFIXES = {".py", ".toml", ".md", ".ipynb", ".cfg", ".txt", ".sh"}
SKIP = {".git", ".venv", "__pycache__", ".whl", ".kfactory"}


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def path_of(module: str) -> Path:
    return ROOT / Path(*module.split(".")).with_suffix(".py")


def main() -> int:
    if subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip():
        print("the tree has uncommitted changes: commit or stash them first", file=sys.stderr)
        return 2
    # build.py and search.py become packages of the same name: move them aside first
    for mod in ("evo.build", "evo.search", "evo.cli"):
        git("mv", str(path_of(mod)), str(path_of(mod).with_name(f"_{mod.split('.')[1]}_old.py")))
    for pkg, doc in PACKAGES.items():
        d = ROOT / "evo" / pkg
        d.mkdir(exist_ok=True)
    for old, new in MOVES.items():
        src = path_of(old)
        if old in ("evo.build", "evo.search", "evo.cli"):
            src = src.with_name(f"_{old.split('.')[1]}_old.py")
        if src.exists():
            git("mv", str(src), str(path_of(new)))
    git("mv", str(ROOT / "evo" / "cuda"), str(ROOT / "evo" / "measure" / "cuda"))
    for pkg, doc in PACKAGES.items():
        init = ROOT / "evo" / pkg / "__init__.py"
        init.write_text(f'"""{doc}"""\n')
    names = sorted(MOVES, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b(?![\w/])")
    paths = {str(path_of(o).relative_to(ROOT)): str(path_of(n).relative_to(ROOT)) for o, n in MOVES.items()}
    paths["evo/cuda/support.cu"] = "evo/measure/cuda/support.cu"
    path_pat = re.compile("|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True)))
    changed = 0
    for f in ROOT.rglob("*"):
        if f.suffix not in SUFFIXES or any(p in SKIP for p in f.parts) or not f.is_file():
            continue
        if f == Path(__file__).resolve():
            continue
        text = f.read_text()
        new = pattern.sub(lambda m: MOVES[m.group(1)], text)
        new = path_pat.sub(lambda m: paths[m.group(0)], new)
        if new != text:
            f.write_text(new)
            changed += 1
    sandbox = path_of("evo.templates.sandbox")
    sandbox.write_text(sandbox.read_text().replace(
        'Path(__file__).resolve().parent.parent / "templates"', 'Path(__file__).resolve().parents[2] / "templates"'))
    print(f"moved {len(MOVES)} modules into {len(PACKAGES)} packages; rewrote references in {changed} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

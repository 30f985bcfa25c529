"""`kfactory export`: finished runs' dispatch tables to a pip-installable package, written whole or not at all."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evo.build.nvrtc import compiler_version
from evo.build.nvrtc_lib import NvrtcLibError, find_nvrtc
from evo.export.document import dispatch_document, op_document, provenance_document
from evo.export.errors import ExportError
from evo.export.family import Family, family_of
from evo.export.kernels import build_kernels
from evo.export.readme import PARTS
from evo.export.runs import RunTable, merge_runs, read_run
from evo.export.write import write_package
from memory.store import Store

_NAME = re.compile(r"[a-z_][a-z0-9_]*")
VERSION = "0.1.0"


@dataclass(frozen=True)
class Exported:
    out: Path
    name: str
    ops: tuple[tuple[str, str, int, int], ...]  # (op, run id, cells, kernels)


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"--out {out} is not empty; give a new or empty folder (nothing is overwritten)")


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ExportError(f"--name {name!r} is not a package name (lower case letters, digits, _; not first a digit)")


def check_runs(runs: Sequence[RunTable]) -> Family:
    """The family that exports these runs; ExportError for an op without one, or two runs of one op that
    the family does not merge (its MERGE)."""
    ops = [r.op for r in runs]
    family = family_of(ops)
    for op in dict.fromkeys(ops):
        if ops.count(op) > 1 and op not in family.merge:
            raise ExportError(f"{ops.count(op)} runs of op {op} given; export one per op")
    return family


def per_op(runs: Sequence[RunTable]) -> list[RunTable]:
    """One table per op, in the order the ops first come: the runs of one op merged (evo.export.runs.merge_runs)."""
    by_op: dict[str, list[RunTable]] = {}
    for r in runs:
        by_op.setdefault(r.op, []).append(r)
    return [merge_runs(rs) for rs in by_op.values()]


def nvrtc_folders(folders: Sequence[Path]) -> dict[str, str]:
    """Other NVRTCs by version ('nvrtc-13.0' -> folder), for cubins this process's NVRTC did not build."""
    out: dict[str, str] = {}
    for d in folders:
        try:
            lib = find_nvrtc(d)
        except NvrtcLibError as e:
            raise ExportError(f"--nvrtc {d}: {e}") from None
        out.setdefault(lib.version, str(d))
    return out


def export(store_path: Path, run_ids: Sequence[str], out: Path, name: str | None = None, workers: int = 2,
           nvrtc: Sequence[Path] = ()) -> Exported:
    """Write the package for these runs to `out` (new or empty); ExportError for anything the user must fix.
    `name`: the package's, else the op family's default; `nvrtc`: folders of the NVRTCs that built the runs'
    cubins, where this process's is another version."""
    if name is not None:
        check_name(name)
    check_out(out)
    if not store_path.exists():
        raise ExportError(f"no store at {store_path} (pass --store PATH)")
    others = nvrtc_folders(nvrtc)
    with Store.open(store_path, read_only=True) as store:
        runs = [read_run(store, r) for r in dict.fromkeys(run_ids)]
        family = check_runs(runs)
        runs = per_op(runs)
        if name is None:
            name = family.name
            check_name(name)
        built = {r.op: build_kernels(store, r, workers, others) for r in runs}
    kernels = {op: ks for op, (ks, _) in built.items()}
    cell_kernel = {op: ids for op, (_, ids) in built.items()}
    dispatch = dispatch_document(name, {r.op: op_document(r, kernels[r.op], cell_kernel[r.op]) for r in runs})
    prov = provenance_document(name, runs, kernels, compiler_version())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_package(tmp, name, VERSION, family, runs, kernels, dispatch, prov,
                      family.readme(name, runs, cell_kernel, prov, PARTS))
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, name, tuple((r.op, "+".join(r.run_ids), len(r.entries), len(kernels[r.op])) for r in runs))

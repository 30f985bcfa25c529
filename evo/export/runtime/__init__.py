"""The generic files of an exported package, copied as they are by evo.export.write: `package/` the
op-independent runtime (dispatch tables, header expressions and the Jinja renderer, the `Choice` record
the loader and launcher read, the cuda.core loader with its NVRTC fallback, launch plans, the launch
guard, the benchmarks' timer and report), `tests/` the shared conftest. The op family's plug-in
(`ops/<op>/export/runtime/`) adds the rest: its API, `choose.py` (its paths, built on `choice.Choice`),
`run.py`, `verify.py`, `reference.py`, `bench.py`, `peers.py`, `__init__.py` and its tests. The factory imports
none of it; `package/torch_compile.py` (torch.compile without a silent eager fallback, which the gate's peers share)
is a link to evo/core/torch_compile.py."""

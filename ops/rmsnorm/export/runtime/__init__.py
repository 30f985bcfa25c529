"""The RMSNorm family's files of an exported package, copied as they are by evo.export.write beside the
engine's generic runtime (evo/export/runtime): `package/` the API, custom ops, fallback, path choice,
first-use check and benchmark; `tests/` the package's CPU and GPU tests. Not imported by the factory."""

"""The KDA family's files of an exported package, copied as they are by evo.export.write beside the
engine's generic runtime (evo/export/runtime): `package/` fla's two entry points, the path choice per
entry point, the float32 torch path, the first-use check and the benchmark against fla; `tests/` the
package's CPU and GPU tests. Not imported by the factory."""

"""The files of an exported package, copied as they are by evo.export.write: `package/` becomes the
importable package, `tests/` its tests (renamed to test_*.py there). Not imported by the factory."""

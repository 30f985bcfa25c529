"""The export stage: finished runs' dispatch tables to a standalone, pip-installable Python package.

runs.py reads a run's table from the store, kernels.py renders and builds its kernels with the factory's
own renderer and builder, document.py writes what the package says about them, family.py finds the op
family's plug-in (`ops/<op>/export/`: its ops, README, description and runtime files), write.py lays the
files out (the generic runtime is in runtime/), make.py does it all, whole or not at all.
"""

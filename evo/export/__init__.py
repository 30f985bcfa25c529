"""The export stage: finished runs' dispatch tables to a standalone, pip-installable Python package.

runs.py reads a run's table from the store, kernels.py renders and builds its kernels with the factory's
own renderer and builder, document.py and readme.py write what the package says about them, write.py
lays the files out (the runtime itself is in runtime/), make.py does it all, whole or not at all.
"""

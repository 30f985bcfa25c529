"""A plan's pdl launch as cuda.core builds it in the factory's worker: programmatic stream serialization set, and
refused by name where the installed cuda.core cannot set it (an exported package's side of it:
tests/unit/test_export_launch_side.py)."""

from __future__ import annotations

import cuda.core
import pytest

from evo.measure.worker import LaunchFault, launch_config


class OldLaunchConfig:  # also used by tests/unit/test_export_launch_side.py
    """cuda.core < 1.2.0's LaunchConfig: no programmatic_stream_serialization keyword."""

    def __init__(self, grid=None, cluster=None, block=None, shmem_size=None, is_cooperative=False):
        self.grid, self.block, self.shmem_size = grid, block, shmem_size


def test_the_worker_sets_programmatic_stream_serialization_only_on_pdl_launches():
    on = launch_config((8, 2, 1), (128, 1, 1), 4096, pdl=True)
    off = launch_config((8, 2, 1), (128, 1, 1), 4096)
    assert on.programmatic_stream_serialization is True and off.programmatic_stream_serialization is False
    assert on.grid == off.grid == (8, 2, 1) and on.shmem_size == off.shmem_size == 4096


def test_the_worker_refuses_a_pdl_launch_it_cannot_make(monkeypatch):
    monkeypatch.setattr(cuda.core, "LaunchConfig", OldLaunchConfig)
    assert launch_config((1, 1, 1), (32, 1, 1), 0).grid == (1, 1, 1)  # an ordinary launch still works
    with pytest.raises(LaunchFault, match=r"pdl.*needs cuda.core >= 1.2.0"):
        launch_config((1, 1, 1), (32, 1, 1), 0, pdl=True)

"""What every child process of a run (compile processes, GPU workers) does first.

Ctrl-C in a terminal reaches the whole process group; the parent alone handles it (it records the
run as interrupted and ends its children), so a child ignores SIGINT instead of printing a
traceback. A child whose parent died without ending it (kill -9) exits within a second: a thread
watches for the parent to go away (a thread-independent check, unlike PR_SET_PDEATHSIG, which
fires when the spawning *thread* ends, and GPU workers are restarted from short-lived threads).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

PARENT_POLL_S = 0.5


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # orphaned: nobody will read our answers


def become_child() -> None:
    """Ignore SIGINT and exit when the parent process goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="kfactory-parent-watch").start()


def run_child(target: Callable[..., None], *args: Any) -> None:
    """A process entry point: become_child(), then target(*args) (spawn pickles target by reference)."""
    become_child()
    target(*args)

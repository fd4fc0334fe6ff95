"""Children that end with the supervisor that started them, however it ends.

A supervisor killed with SIGKILL (or by the OOM killer) runs no handler: its workers would go on
serving the port, and a new `edgerun serve` on that port would join them (SO_REUSEPORT). On Linux
each child asks the kernel for SIGTERM when its parent dies (`prctl(PR_SET_PDEATHSIG)`, kept across
exec), so it stops as on any SIGTERM: a worker drains its streams and closes the store. Elsewhere
nothing is asked (None).

The signal comes when the thread that started the child ends, so children are started from the
supervisor's main thread (as `Supervisor.run` does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def stop_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that makes the child get SIGTERM when this process
    dies; None where the kernel has no such request."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:  # runs in the forked child, before exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request: nobody will send it
            os._exit(1)

    return in_child

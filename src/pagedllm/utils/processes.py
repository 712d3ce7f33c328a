"""Helpers for the engine's child processes: a free TCP port for a rendezvous, the thread
count a spawned child should use, and the signal handling every child installs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "PAGEDLLM_NUM_THREADS")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (for torch.distributed's rendezvous)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def threads_per_process(num_processes: int) -> int:
    """This machine's cores shared out over `num_processes` busy processes (PAGEDLLM_NUM_THREADS
    when set)."""
    named = os.environ.get("PAGEDLLM_NUM_THREADS")
    if named:
        return int(named)
    return max(1, (os.cpu_count() or 1) // num_processes)


@contextlib.contextmanager
def child_thread_env(num_threads: int) -> Iterator[None]:
    """Children spawned inside inherit this thread count: the environment as it is at
    start(), which their OpenMP runtimes (torch's and the C kernels') read at load."""
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(num_threads)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def install_child_signal_handlers() -> None:
    """A spawned child (engine core, worker rank): SIGINT ignored (a Ctrl-C reaches the whole
    process group; the parent decides the order of shutdown), SIGTERM leaves via SystemExit
    so `finally` blocks run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_system_exit)

"""The supervisor of a node's workers: start them, restart the dead, stop them all.

``workers: N`` forks N processes (after the settings are loaded and the port
checked, before anything else is built: each worker builds its own objects).
A worker that dies, however it dies, is replaced within ``CHECK_EVERY``
seconds; its live Prometheus gauges are dropped first (``metrics_process.forget_process``),
so a dead worker's requests in flight are not summed into the node's. The
metrics directory is the supervisor's: made empty at start, removed at exit.
SIGTERM and SIGINT stop every worker (each drains within ``shutdown_timeout``),
SIGHUP is passed on (each worker re-reads its config). The node's shared
state needs nothing from the supervisor: it lives in the cache directory
(``gateway/node/__init__.py``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gateway.app.listener import bind
from gateway.config.settings import Settings
from gateway.obs.process import forget_process

log = logging.getLogger("hoard")
CHECK_EVERY = 0.2  # seconds between the supervisor's looks at its workers


def supervise(settings: Settings, banner: str, worker: Callable[[Path, bool], None]) -> None:
    """Start ``workers`` processes running ``worker(metrics_dir, hupped)``, restart any
    that dies, stop them all on SIGTERM/SIGINT, forward SIGHUP to them. ``hupped``: a
    SIGHUP came before the worker started (it must apply what its siblings applied)."""
    bind(settings.listen, reuse_port=True).close()  # a busy port: one line, before any worker
    metrics_dir = settings.cache.dir / f"prometheus-{os.getpid()}"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    context = multiprocessing.get_context("fork")
    stopping = False

    hupped = False  # a SIGHUP was passed on: a worker started after it re-reads the config

    def spawn(index: int) -> multiprocessing.process.BaseProcess:
        process = context.Process(target=worker, args=(metrics_dir, hupped),
                                  name=f"hoard-worker-{index}")  # fmt: skip
        process.start()
        return process

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in workers:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    assert isinstance(settings.workers, int)  # "auto" is resolved when the config is loaded
    workers = [spawn(i) for i in range(settings.workers)]

    def forward(signum: int, frame: object) -> None:
        nonlocal hupped
        hupped = True
        for process in workers:  # each worker re-reads the config itself
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, forward)
    print(f"{banner}\n  ({settings.workers} worker processes)", flush=True)
    try:
        while not stopping:
            for index, process in enumerate(workers):
                if not process.is_alive() and not stopping:
                    log.error(
                        "worker %s exited with %s; restarting it", process.name, process.exitcode
                    )
                    if process.pid is not None:
                        forget_process(metrics_dir, process.pid)
                    workers[index] = spawn(index)
            time.sleep(CHECK_EVERY)
        deadline = time.monotonic() + settings.shutdown_timeout + 5
        for process in workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)

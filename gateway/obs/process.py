"""The metrics of the node's processes, and the multiprocess mode that sums workers.

With ``workers: N`` every worker writes its metric values to memory-mapped
files in the node's multiprocess directory, and a scrape of any worker sums
them (``metrics.py``'s ``render``, with ``render_node``). What cannot be shared that way — the
standard ``process_*`` metrics of each process — is read here from ``/proc``
for the whole tree of the node's processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


def enable_multiprocess(directory: Path) -> None:
    """Make metrics created from now on in this process live in ``directory``.

    prometheus-client's multiprocess mode: each worker writes its values to
    memory-mapped files there and any worker's ``/metrics`` sums them. Call it
    in each worker before building ``Metrics``; the directory must be empty
    when the workers start.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()


def forget_process(directory: Path, pid: int) -> None:
    """Drop the gauges of worker ``pid``, which died (the supervisor calls this).

    Its ``live*`` gauges (origin requests in flight and queued, prefetch
    streams) would otherwise be summed into every scrape until the node
    restarts; so would its ``max`` gauges (a breaker it saw open). Its counters
    and histograms stay: what it did still happened.
    """
    multiprocess.mark_process_dead(pid, str(directory))
    for stale in directory.glob(f"gauge_max_{pid}.db"):
        stale.unlink(missing_ok=True)


def render_node(directory: Path, process: Collector) -> bytes:
    """A scrape of the node in the text format: every worker's values in ``directory``
    summed, and ``process``, the process metrics of the node's tree."""
    combined = CollectorRegistry()
    multiprocess.MultiProcessCollector(combined, path=str(directory))
    combined.register(process)
    return generate_latest(combined)


class ProcessTreeCollector(Collector):
    """The standard ``process_*`` metrics of a whole Hoard node.

    With several workers the node is a supervisor and its forked workers;
    prometheus-client's multiprocess mode cannot share process metrics, so the
    worker that answers a scrape reads every process of the tree from
    ``/proc`` and sums them (CPU, memory, file descriptors; the oldest start
    time; the largest fd limit), as a single-process node would report.
    """

    _COMBINE = {"process_start_time_seconds": min, "process_max_fds": max}

    def __init__(self, tree: bool) -> None:
        self._tree = tree

    def _pids(self) -> list[int]:
        if not self._tree:
            return [os.getpid()]
        parent = os.getppid()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as listing:
                return [parent, *map(int, listing.read().split())]
        except OSError:  # no /proc children list here: this worker alone
            return [os.getpid()]

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        seen: dict[str, list[float]] = {}  # sample name -> its value in each process
        for pid in self._pids():
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                families.setdefault(family.name, family)
                for sample in family.samples:
                    seen.setdefault(sample.name, []).append(sample.value)
        for family in families.values():
            family.samples = [
                sample._replace(value=self._COMBINE.get(sample.name, sum)(seen[sample.name]))
                for sample in family.samples
            ]
            yield family

"""Showing a warm job's progress: a live ``rich`` bar on a terminal, plain lines elsewhere.

The numbers (rate, ETA) are the server's, summed over the cluster's nodes, not
estimated here: the client only polls ``GET /_hoard/warm/{id}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

FINISHED = ("done", "failed", "cancelled")


def size(n: float | None) -> str:
    """Bytes in binary units: ``1536`` → ``1.5 KiB``."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def summary(status: dict[str, Any]) -> str:
    """One line: state, objects, bytes, rate, ETA, errors."""
    total = status.get("objects_total")
    line = (
        f"{status['state']:<9} {status.get('objects_done', 0)}/{'?' if total is None else total}"
        f" objects  {size(status.get('bytes_done'))}/{size(status.get('bytes_total'))}"
        f"  {size(status.get('rate', 0.0))}/s  ETA {duration(status.get('eta'))}"
    )
    if status.get("errors"):
        line += f"  errors {status['errors']}"
    return line


def describe(status: dict[str, Any]) -> str:
    """Several lines: the summary, the reason and a few error samples."""
    lines = [f"job {status['id']}: {summary(status)}"]
    if status.get("reason"):
        lines.append(f"  reason: {status['reason']}")
    lines += [f"  error: {sample}" for sample in status.get("error_samples", [])]
    return "\n".join(lines)


def follow(
    poll: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None],
    out: TextIO,
    interval: float = 1.0,
) -> dict[str, Any]:
    """Show progress until the job finishes; returns its last status.

    A terminal gets a live bar; anything else (a pipe, a CI log) gets one plain
    line per change, at most one per ``interval``.
    """
    console = Console(file=out)
    if console.is_terminal:
        return _bar(poll, sleep, console, interval)
    last = ""
    while True:
        status = poll()
        line = summary(status)
        if line != last:
            print(line, file=out, flush=True)
            last = line
        if status["state"] in FINISHED:
            return status
        sleep(interval)


def _bar(
    poll: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None],
    console: Console,
    interval: float,
) -> dict[str, Any]:
    columns = (
        TextColumn("{task.fields[state]:<9}"),
        BarColumn(),
        TextColumn("{task.fields[objects]} objects"),
        TextColumn("{task.fields[bytes]}"),
        TextColumn("{task.fields[rate]}/s"),
        TextColumn("ETA {task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("warm", total=None, **_fields({"state": "queued"}))
        while True:
            status = poll()
            total = status.get("bytes_total")
            bar.update(task, completed=status.get("bytes_done", 0), total=total or None,
                       **_fields(status))  # fmt: skip
            if status["state"] in FINISHED:
                return status
            sleep(interval)


def _fields(status: dict[str, Any]) -> dict[str, str]:
    total = status.get("objects_total")
    return {
        "state": status["state"],
        "objects": f"{status.get('objects_done', 0)}/{'?' if total is None else total}",
        "bytes": f"{size(status.get('bytes_done', 0))}/{size(status.get('bytes_total'))}",
        "rate": size(status.get("rate", 0.0)),
        "eta": duration(status.get("eta")),
    }

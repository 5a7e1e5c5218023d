"""Processes: ports, readiness, stopping, CPU pinning and peak memory of a process tree.

Everything here is bounded in time: every wait has a deadline, every stop ends
in SIGKILL. Nothing here kills by name; only the processes the harness started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 2xx; raise if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if 200 <= response.status < 300:
                    return
        except urllib.error.HTTPError as exc:
            last = exc.code
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s (last: {last})")


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL. Safe on an exited process."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def children(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc; processes that vanish meanwhile are skipped)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                # The command name may contain spaces; the fields after ")" are fixed.
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parent_of[int(entry)] = ppid
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        kids = [child for child, ppid in parent_of.items() if ppid == current]
        found.extend(kids)
        frontier.extend(kids)
    return found


def peak_rss(roots: list[int]) -> int | None:
    """Sum of VmHWM (peak resident set) over ``roots`` and their descendants, in bytes."""
    total = 0
    seen = False
    for pid in {p for root in roots for p in [root, *children(root)]}:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
                        seen = True
        except OSError:
            continue
    return total if seen else None


def tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants."""
    return sorted({p for root in roots for p in [root, *children(root)]})


def memory(pid: int) -> tuple[str, int, int] | None:
    """(command name, VmRSS, VmHWM) of one process in bytes; None once it has gone."""
    fields: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name in ("Name", "VmRSS", "VmHWM"):
                    fields[name] = value.strip()
    except OSError:
        return None
    if "VmHWM" not in fields:  # a zombie
        return None
    kib = {k: int(fields.get(k, "0 kB").split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}
    return fields.get("Name", "?"), kib["VmRSS"], kib["VmHWM"]


def reset_peak(pids: list[int]) -> bool:
    """Reset VmHWM to the current RSS (``clear_refs`` 5, Linux 4.0+, own processes or root).

    True if every process took it: a peak read later is then the peak since now.
    """
    done = bool(pids)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            done = False
    return done


@dataclass(frozen=True)
class Pinning:
    """Which CPUs the server under test and the load generators may use.

    On two cores: the server on CPU 0, the generators on CPU 1, so a greedy
    generator cannot starve the server it measures. The origin (moto and the
    counting proxy) is not pinned. ``enabled=False`` leaves everything to the
    scheduler.
    """

    enabled: bool
    server: frozenset[int] = field(default_factory=frozenset)
    generator: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def detect(cls, want: bool) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0))
        if not want or len(cpus) < 2 or shutil.which("taskset") is None:
            return cls(enabled=False)
        half = max(1, len(cpus) // 2)
        return cls(True, frozenset(cpus[:half]), frozenset(cpus[half:]))

    def server_prefix(self) -> list[str]:
        """A command prefix that pins the server (empty when pinning is off)."""
        if not self.enabled:
            return []
        return ["taskset", "-c", ",".join(map(str, sorted(self.server)))]

    def generator_prefix(self) -> list[str]:
        if not self.enabled:
            return []
        return ["taskset", "-c", ",".join(map(str, sorted(self.generator)))]

    def server_cpus(self) -> int:
        return len(self.server) if self.enabled else (os.cpu_count() or 1)

    def describe(self) -> str:
        if not self.enabled:
            return "off (scheduler decides)"
        return (
            f"server on CPU {','.join(map(str, sorted(self.server)))}, "
            f"load generators on CPU {','.join(map(str, sorted(self.generator)))} "
            "(taskset / sched_setaffinity); origin unpinned"
        )


def pin_tree(roots: list[int], cpus: frozenset[int]) -> None:
    """Every thread of ``roots`` and their descendants on ``cpus`` (threads and children
    started later inherit it from the one that starts them)."""
    for pid in tree(roots):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` so far (``/proc/PID/stat`` utime + stime).

    Processes that vanish meanwhile count nothing: call it on the same tree
    before and after a run and take the difference.
    """
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")

"""How many cores this process may use: what ``workers: auto`` starts.

``os.cpu_count()`` is the machine's, which in a container is a lie twice
over: the CPU affinity mask (``taskset``, Kubernetes' static CPU manager)
may allow fewer, and a cgroup CPU quota (a pod's ``limits.cpu``, Compose's
``cpus``) may allow the time of fewer still. The answer is the smallest of
the affinity mask's size and the quota, rounded down (a quota of 1.5 cores
runs one worker at full speed rather than two throttled), never below one.

The quota is cgroup v2's ``cpu.max`` ("max 100000" or "<quota> <period>") of
this process's cgroup and its ancestors (a parent may be the tighter), or
cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def available_cores(cgroup: Path = CGROUP, proc_self: Path = Path("/proc/self/cgroup")) -> int:
    """Cores this process may use: affinity mask and cgroup quota, the smaller."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_quota(cgroup, proc_self)
    if quota is not None:
        cores = min(cores or 1, math.floor(quota))
    return max(1, cores or 1)


def cgroup_quota(
    cgroup: Path = CGROUP, proc_self: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota in cores (None: unlimited, or no cgroup to read)."""
    own = _own_cgroup(proc_self)
    quotas = [q for q in (_v2_quota(cgroup, own), _v1_quota(cgroup)) if q is not None]
    return min(quotas) if quotas else None


def _own_cgroup(proc_self: Path) -> str:
    """This process's cgroup v2 path ("0::/kubepods/..."), or "/"."""
    try:
        for line in proc_self.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        pass
    return "/"


def _v2_quota(cgroup: Path, own: str) -> float | None:
    found: list[float] = []
    directory = cgroup / own.strip("/")
    while True:
        quota = _ratio(directory / "cpu.max")
        if quota is not None:
            found.append(quota)
        if directory == cgroup or cgroup not in directory.parents:
            break
        directory = directory.parent
    return min(found) if found else None


def _ratio(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max" or float(period) <= 0:
        return None
    return float(quota) / float(period)


def _v1_quota(cgroup: Path) -> float | None:
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((cgroup / name / "cpu.cfs_quota_us").read_text())
            period = int((cgroup / name / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None

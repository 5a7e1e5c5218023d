"""Result rows and what is made of them: JSON, a Markdown table, ratios, plots.

Absolute numbers on a shared 2-core machine mean little; the ratios between
targets measured in the same run are the result. ``ratios()`` compares Hoard
with each peer phase by phase, and ``goals()`` checks the targets of the
load-test issue against this run's numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MB = 1e6
MiB = 1024**2
RSS_TARGET_MIB = 150  # the per-worker allowance over the memory tier
PEERS = {
    "hoard": ("nginx", "static", "direct"),
    "hoard-disk": ("nginx", "static", "direct"),
    "hoard-cluster": ("nginx-3", "static", "direct"),
}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Row:
    target: str
    workload: str
    phase: str
    generator: str = "boto3"
    wall_s: float = 0.0
    objects: int = 0
    bytes: int = 0
    errors: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    origin: dict[str, int] = field(default_factory=dict)
    rss_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def objects_per_s(self) -> float:
        return self.objects / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def measured(self) -> bool:
        return self.wall_s > 0 and self.objects > 0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "objects_per_s": self.objects_per_s, "mb_per_s": self.mb_per_s}


def _metric(row: Row) -> tuple[str, float]:
    """The throughput figure that matters for this phase: objects/s or MB/s."""
    small = row.workload in (
        "epochs",
        "train",
        "train-prefetch",
        "train-warm",
    ) or row.phase.startswith(("list", "small"))
    return ("obj/s", row.objects_per_s) if small else ("MB/s", row.mb_per_s)


def _find(rows: list[Row], target: str, workload: str, phase: str) -> Row | None:
    for row in rows:
        if (row.target, row.workload, row.phase) == (target, workload, phase) and row.measured:
            return row
    return None


def ratios(rows: list[Row], subject: str = "hoard") -> list[dict[str, Any]]:
    """Per (workload, phase) of ``subject``: throughput of subject / each of its peers."""
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.target != subject or not row.measured:
            continue
        unit, mine = _metric(row)
        entry: dict[str, Any] = {"workload": row.workload, "phase": row.phase, "unit": unit}
        for peer in PEERS[subject]:
            other = _find(rows, peer, row.workload, row.phase)
            value = _metric(other)[1] if other else 0.0
            entry[f"{subject}/{peer}"] = mine / value if value > 0 else None
        out.append(entry)
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def goals(rows: list[Row], meta: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) for each target of the load-test issue."""
    out: list[tuple[str, str, str]] = []

    def check(goal: str, value: float | None, ok: bool | None, shown: str) -> None:
        verdict = (
            "no data" if value is None else ("info" if ok is None else "met" if ok else "MISSED")
        )
        out.append((goal, shown if value is not None else "—", verdict))

    later = [r for r in rows if r.workload == "epochs" and r.phase != "epoch 1" and r.measured]
    for peer, want in (("nginx", 1.2), ("static", 0.8)):
        pairs = [(r, _find(rows, peer, "epochs", r.phase)) for r in later if r.target == "hoard"]
        values = [r.objects_per_s / p.objects_per_s for r, p in pairs if p and p.objects_per_s]
        low = min(values) if values else None
        check(f"epochs 2+ images obj/s: hoard ≥ {want}x {peer}", low,
              None if low is None else low >= want, f"{_fmt(low)}x (worst epoch)")  # fmt: skip
    dataset = meta.get("dataset", {}).get("images_bytes") or 0
    for target in ("hoard-cluster", "nginx-3", "hoard", "nginx"):
        total = sum(
            r.origin.get("bytes", 0) for r in rows if r.target == target and r.workload == "epochs"
        )
        if any(r.target == target and r.workload == "epochs" for r in rows) and dataset:
            want = 1.05 if target.startswith("hoard") else None
            share = total / dataset
            check(f"origin bytes over 3 epochs, {target}" + (f" ≤ {want}x dataset" if want else ""),
                  share, share <= want if want else None, f"{share:.2f}x dataset")  # fmt: skip
    block = 8 * MiB
    crowd = next(
        (
            r
            for r in rows
            if r.target == "hoard" and r.workload == "herd" and r.phase.startswith("get x")
        ),
        None,
    )
    if crowd:
        blocks = math.ceil(meta.get("dataset", {}).get("shards", [0])[-1] / block)
        check(f"herd GET: hoard origin GETs = block count ({blocks})", crowd.origin.get("GET"),
              crowd.origin.get("GET") == blocks, str(crowd.origin.get("GET")))  # fmt: skip
        ratio = crowd.extra.get("slowest_vs_alone")
        check("herd GET: slowest client ≤ 1.3x one client alone", ratio,
              ratio is not None and ratio <= 1.3, f"{_fmt(ratio)}x")  # fmt: skip
        # The same ratio for the peers: static shows how much of it is the load generator
        # (64 clients' bytes through the generator CPU), not the server.
        for peer in ("nginx", "static"):
            other = next((r for r in rows if r.target == peer and r.workload == "herd"
                          and r.phase == crowd.phase and r.measured), None)  # fmt: skip
            if other is not None:
                value = other.extra.get("slowest_vs_alone")
                check(f"herd GET: slowest client / alone, {peer} (reference)", value, None,
                      f"{_fmt(value)}x")  # fmt: skip
    lister = next(
        (
            r
            for r in rows
            if r.target == "hoard" and r.workload == "herd" and r.phase.startswith("list")
        ),
        None,
    )
    if lister:
        lists = lister.origin.get("LIST")
        check("herd LIST: hoard origin LISTs = 1", lists, lists == 1, str(lists))
    hoard_stream = _find(rows, "hoard", "stream", "cold")
    direct_stream = _find(rows, "direct", "stream", "cold")
    if hoard_stream and direct_stream and direct_stream.mb_per_s:
        ratio = hoard_stream.mb_per_s / direct_stream.mb_per_s
        check("stream cold: hoard ≥ 2x direct", ratio, ratio >= 2, f"{ratio:.2f}x")
    for target in ("hoard", "hoard-cluster", "nginx", "nginx-3", "static"):
        streamed = [r for r in rows if r.target == target and r.workload == "rss" and r.measured
                    and r.phase != "upload" and r.extra.get("rss_worker_mib") is not None]  # fmt: skip
        if not streamed:
            continue
        worst = max(streamed, key=lambda r: r.extra["rss_worker_mib"])
        worker, tier = worst.extra["rss_worker_mib"], worst.extra.get("memory_tier_mib")
        clients = (
            f"{worst.extra.get('clients')} clients x {_fmt(worst.extra.get('object_mib'), 0)} MiB"
        )
        shown = f"{worker:,.0f} MiB per worker ({worst.phase}; sum {worst.extra['rss_sum_mib']:,.0f} MiB)"
        if tier is None:  # a peer without a memory tier: for reference
            check(f"rss ({clients}): {target} peak RSS per worker (reference)", worker, None, shown)
            continue
        over = worker - tier
        allowance = RSS_TARGET_MIB + tier
        used = worst.extra.get("tier_used_mib")
        check(f"rss ({clients}): {target} peak RSS per worker ≤ {RSS_TARGET_MIB} MiB + memory tier "
              f"({tier:,.0f} MiB)", over, over <= RSS_TARGET_MIB,
              f"{shown}: {worker / allowance:.2f}x of {allowance:,.0f} MiB; per worker - tier = "
              f"{over:,.0f} MiB (≤ {RSS_TARGET_MIB})"
              + (f"; tier in use {used:,.0f} MiB" if used is not None else ""))  # fmt: skip
    for row in (r for r in rows if r.workload == "rss" and r.phase == "upload"):
        _upload_goal(row, check)
    cold, ahead = (
        _find(rows, "hoard", "train", "epoch 1"),
        _find(rows, "hoard", "train-prefetch", "epoch 1"),
    )
    if cold and ahead:
        base, share = cold.extra.get("data_wait_share"), ahead.extra.get("data_wait_share")
        ratio = share / base if share is not None and base else None
        check("train epoch 1: data-wait share with prefetch ≤ 0.5x cold", ratio,
              ratio is not None and ratio <= 0.5,
              f"{(share or 0) * 100:.1f}% vs {(base or 0) * 100:.1f}% cold: {_fmt(ratio)}x")  # fmt: skip
    trained = _find(rows, "hoard", "train", "epoch 2")
    if trained:
        share = trained.extra.get("data_wait_share")
        check("train epoch 2: hoard data-wait share ≤ 5%", share,
              share is not None and share <= 0.05, f"{(share or 0) * 100:.1f}%")  # fmt: skip
    return out


def _upload_goal(row: Row, check: Callable[[str, float | None, bool | None, str], None]) -> None:
    """The write path's targets while a huge multipart upload and PutObject pass at once.

    The issue's allowance, as for reads: 150 MiB per worker over the memory
    tier. The phase runs after the reads, whose buffers may still be resident,
    so its growth (peak over the largest process at the phase's start) is
    checked too: flat memory means the uploads' bytes are not held.
    """
    e = row.extra
    worker, tier = e.get("rss_worker_mib"), e.get("memory_tier_mib")
    shape = f"rss upload ({e.get('shape')}, at once)"
    if worker is None or tier is None:
        check(f"{shape}: {row.target} peak RSS per worker", None, None, "")
        return
    over, growth = worker - tier, e.get("rss_growth_mib")
    used = e.get("tier_used_mib")
    ok = row.errors == 0 and row.objects == e.get("clients")
    check(f"{shape}: {row.target} peak RSS per worker ≤ {RSS_TARGET_MIB} MiB + memory tier "
          f"({tier:,.0f} MiB)", over, ok and over <= RSS_TARGET_MIB,
          f"{worker:,.0f} MiB per worker (sum {e.get('rss_sum_mib', 0):,.0f} MiB); per worker - "
          f"tier = {over:,.0f} MiB (≤ {RSS_TARGET_MIB})"
          + (f"; tier in use {used:,.0f} MiB" if used is not None else "")
          + f"; {row.bytes / MiB:,.0f} MiB in {row.wall_s:,.0f} s; objects verified at the "
          f"origin {row.objects}/{e.get('clients')}")  # fmt: skip
    check(f"{shape}: {row.target} RSS growth per worker during the uploads ≤ {RSS_TARGET_MIB} "
          "MiB", growth, ok and growth is not None and growth <= RSS_TARGET_MIB,
          f"{_fmt(growth, 0)} MiB (from {_fmt(e.get('rss_start_mib'), 0)} to "
          f"{worker:,.0f} MiB)")  # fmt: skip


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [f"# Hoard load test {meta['run_id']}", ""]
    keys = ("scale", "started", "finished", "gateway", "origin", "pinning", "dataset", "generators")
    for key in keys:
        if key in meta:
            lines.append(f"- **{key}**: {_inline(meta[key])}")
    for name, reason in meta.get("unavailable", {}).items():
        lines.append(f"- **{name}**: {reason}")
    lines += ["", "## Results", "",
              "| target | workload | phase | gen | wall s | obj/s | MB/s | p50 ms | p99 ms "
              "| origin GET/HEAD/LIST | origin MB | server peak RSS MiB | errors | notes |",
              "|" + "---|" * 14]  # fmt: skip
    for r in rows:
        o = r.origin
        rss = f"{r.rss_bytes / MiB:.0f}" if r.rss_bytes else "—"
        notes = "; ".join(x for x in (r.note, _extras(r.extra)) if x)
        lines.append(
            f"| {r.target} | {r.workload} | {r.phase} | {r.generator} | {r.wall_s:.2f} "
            f"| {r.objects_per_s:,.0f} | {r.mb_per_s:,.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {o.get('GET', 0)}/{o.get('HEAD', 0)}/{o.get('LIST', 0)} "
            f"| {o.get('bytes', 0) / MB:,.1f} | {rss} | {r.errors} | {notes} |"
        )
    for subject, peers in PEERS.items():
        table = ratios(rows, subject)
        if not table:
            continue
        lines += ["", f"## Ratios: {subject} / peers (same run; throughput, above 1 = {subject} faster)",
                  "", "| workload | phase | unit | " + " | ".join(f"{subject}/{p}" for p in peers) + " |",
                  "|---|---|---|" + "---|" * len(peers)]  # fmt: skip
        for e in table:
            cells = " | ".join(_fmt(e[f"{subject}/{p}"]) for p in peers)
            lines.append(f"| {e['workload']} | {e['phase']} | {e['unit']} | {cells} |")
    streamed = [r for r in rows if r.workload == "rss" and r.measured and r.phase != "upload"]
    if streamed:
        lines += ["", "## Peak RSS while clients stream large objects (rss)", "",
                  "Peak per process since the phase began; per worker = the largest process, "
                  "sum = every process of the target. The issue's target: per worker - memory "
                  f"tier ≤ {RSS_TARGET_MIB} MiB.", "",
                  "| target | phase | clients x MiB | wall s | MB/s | RSS per worker at start MiB "
                  "| peak RSS per worker MiB | sum MiB | processes | memory tier MiB (in use) "
                  f"| per worker - tier MiB | ÷ ({RSS_TARGET_MIB} MiB + tier) | errors |",
                  "|" + "---|" * 13]  # fmt: skip
        for r in streamed:
            e = r.extra
            tier, over = e.get("memory_tier_mib"), e.get("worker_minus_tier_mib")
            used = f" ({_fmt(e['tier_used_mib'], 0)})" if "tier_used_mib" in e else ""
            share = None if tier is None else e["rss_worker_mib"] / (RSS_TARGET_MIB + tier)
            lines.append(
                f"| {r.target} | {r.phase} | {e.get('clients')} x {_fmt(e.get('object_mib'), 0)} "
                f"| {r.wall_s:.1f} | {r.mb_per_s:,.1f} | {_fmt(e.get('rss_start_mib'), 0)} "
                f"| {_fmt(e.get('rss_worker_mib'), 0)} | {_fmt(e.get('rss_sum_mib'), 0)} "
                f"| {e.get('processes', '—')} | {_fmt(tier, 0)}{used} | {_fmt(over, 0)} "
                f"| {_fmt(share)} | {r.errors} |"
            )
    lines += _upload_table([r for r in rows if r.workload == "rss" and r.phase == "upload"])
    lines += capacity_table(rows)
    checks = goals(rows, meta)
    if checks:
        lines += ["", "## Targets of the load-test issue", "", "| goal | measured | verdict |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {goal} | {shown} | {verdict} |" for goal, shown, verdict in checks]
    lines.append("")
    return "\n".join(lines)


def capacity_table(rows: list[Row]) -> list[str]:
    """The capacity workload per core: req/s, server CPU per request, p99, ratios to nginx.

    A header-signed phase is compared with the peers' presigned phase of the same
    objects: nginx verifies no signature, so the ratio is the honest cost of security.
    """
    measured = [r for r in rows if r.workload == "capacity" and r.measured]
    if not measured:
        return []
    lines = ["", "## Capacity per core (wrk; medians of the runs)", "",
             "Server CPU: user + system time of the server's processes over the run, per "
             "request and per MiB sent. Ratios: req/s of the target / req/s of the peer (MB/s "
             "for large objects; above 1 = faster); CPU ratio: the peer's µs / the target's, "
             "per request (per MiB for large objects, of which a run completes few; above 1 = "
             "cheaper).", "",
             "| target | phase | req/s | MB/s | CPU µs/req | CPU µs/MiB | p99 ms "
             "| vs nginx req/s | vs nginx CPU | vs static req/s | vs static CPU "
             "| p99 / nginx's | runs req/s | nginx cache status |", "|" + "---|" * 14]  # fmt: skip
    for r in measured:
        peer_phase = r.phase.removesuffix(" sigv4")
        cost = "cpu_us_per_mib" if r.phase.startswith("large") else "cpu_us_per_req"
        cells = []
        for peer in ("nginx", "static"):
            other = _find(rows, peer, "capacity", peer_phase)
            mine, theirs = r.extra.get(cost), other and other.extra.get(cost)
            cells.append(_fmt(_metric(r)[1] / _metric(other)[1]) if other else "—")
            cells.append(_fmt(theirs / mine) if mine and theirs else "—")
        nginx = _find(rows, "nginx", "capacity", peer_phase)
        p99 = _fmt(r.p99_ms / nginx.p99_ms) if nginx and nginx.p99_ms else "—"
        lines.append(
            f"| {r.target} | {r.phase} | {r.objects_per_s:,.0f} | {r.mb_per_s:,.1f} "
            f"| {_fmt(r.extra.get('cpu_us_per_req'), 1)} "
            f"| {_fmt(r.extra.get('cpu_us_per_mib'), 1)} | {r.p99_ms:.1f} | {' | '.join(cells)} "
            f"| {p99} | {r.extra.get('runs_req_s', '—')} | {r.extra.get('cache_status', '—')} |"
        )
    return lines


def _upload_table(uploaded: list[Row]) -> list[str]:
    if not uploaded:
        return []
    lines = ["", "## Peak RSS while large uploads pass through (rss, upload)", "",
             "A multipart upload and a PutObject at once, from lean clients; peak per process "
             "since the phase began, growth over the largest process at its start. Each object "
             "is checked at the origin (size, ETag from the MD5s sent, one range).", "",
             "| target | uploads | wall s | MB/s | RSS per worker at start MiB | peak RSS per worker "
             "MiB | growth MiB | sum MiB | memory tier MiB (in use) | verified | errors |",
             "|" + "---|" * 11]  # fmt: skip
    for r in uploaded:
        e = r.extra
        used = f" ({_fmt(e['tier_used_mib'], 0)})" if "tier_used_mib" in e else ""
        lines.append(
            f"| {r.target} | {e.get('shape', '—')} | {r.wall_s:.1f} | {r.mb_per_s:,.1f} "
            f"| {_fmt(e.get('rss_start_mib'), 0)} | {_fmt(e.get('rss_worker_mib'), 0)} "
            f"| {_fmt(e.get('rss_growth_mib'), 0)} | {_fmt(e.get('rss_sum_mib'), 0)} "
            f"| {_fmt(e.get('memory_tier_mib'), 0)}{used} | {r.objects}/{e.get('clients', '—')} "
            f"| {r.errors}{'; ' + e['first_error'] if 'first_error' in e else ''} |"
        )
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _extras(extra: dict[str, Any]) -> str:
    shown = []
    for key, value in extra.items():
        if isinstance(value, float):
            shown.append(f"{key}={value:.3g}")
        elif isinstance(value, int | str):
            shown.append(f"{key}={value}")
    return ", ".join(shown)


def write(rows: list[Row], meta: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``<run_id>.json``, ``.md`` and the plots (if matplotlib is there)."""
    out.mkdir(parents=True, exist_ok=True)
    base = out / meta["run_id"]
    paths = {"json": base.with_suffix(".json"), "md": base.with_suffix(".md")}
    doc = {"run": meta, "rows": [r.as_json() for r in rows],
           "ratios": {subject: ratios(rows, subject) for subject in PEERS},
           "goals": [dict(zip(("goal", "measured", "verdict"), g, strict=True)) for g in goals(rows, meta)]}  # fmt: skip
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    paths["md"].write_text(markdown(rows, meta))
    try:
        from loadtest import plots
    except ImportError as exc:  # matplotlib is not a gateway dependency
        print(f"no plots: {exc} (pip install matplotlib)")
        return paths
    paths.update(plots.draw(rows, base))
    return paths

"""``python -m loadtest run --scale quick|full [--targets a,b] [--workloads x,y]``.

Also ``python -m loadtest hitprofile [-n N] [--cases a,b]`` (``hitprofile.py``: CPU
per stage of a warm wire hit), ``python -m loadtest instructions [-n N] [--cases a,b]``
(``instructions.py``: machine instructions per warm hit, counted under callgrind),
``python -m loadtest soak [--minutes M] ...``
(``soak.py``: RSS under a bounded mixed load) and ``python -m loadtest stall
[--blocks N]`` (``stallrun.py``: origin GETs per block while the origin stalls);
their options are their modules'.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from loadtest.datasets import SCALES
from loadtest.run import WORKLOADS, Options, run
from loadtest.targets import ALL
from loadtest.wrkload import PHASES

DEFAULT_TARGETS = "direct,nginx,nginx-3,hoard,hoard-cluster,static"


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest", description="Hoard benchmarks")
    commands = p.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="run the benchmark and write loadtest/results/")
    r.add_argument("--scale", choices=sorted(SCALES), default="quick")
    r.add_argument("--targets", default=DEFAULT_TARGETS,
                   type=lambda t: _names(t, ALL, "target"), help=f"comma list of {', '.join(ALL)}")  # fmt: skip
    r.add_argument("--workloads", default=",".join(WORKLOADS),
                   type=lambda w: _names(w, tuple(WORKLOADS), "workload"),
                   help=f"comma list of {', '.join(WORKLOADS)}")  # fmt: skip
    r.add_argument("--phases", default="",
                   type=lambda p: _names(p, tuple(x.name for x in PHASES), "capacity phase"),
                   help="capacity only: comma list of its phases, e.g. 'small 4k wide' (default: all)")  # fmt: skip
    r.add_argument("--wide-objects", type=int, default=None,
                   help="objects of the capacity phase 'small 4k wide' (default: the scale's)")  # fmt: skip
    r.add_argument("--origin", choices=("auto", "netns", "loopback"), default="auto",
                   help="where moto runs: a network namespace (auto falls back to loopback)")  # fmt: skip
    r.add_argument("--rtt-ms", type=float, default=20.0, help="origin round trip (10 ms each way)")
    r.add_argument("--train-compute-ms", type=float, default=None,
                   help="emulated accelerator time per train batch (default: the scale's)")  # fmt: skip
    r.add_argument("--rate-mbit", type=float, default=1000.0, help="origin bandwidth cap")
    r.add_argument("--stream-mbit", type=float, default=400.0,
                   help="bandwidth cap of one origin response (0: none)")  # fmt: skip
    r.add_argument(
        "--no-pin", action="store_true", help="do not pin server and generators to cores"
    )
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--out", type=Path, default=Options.out)
    r.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    return p


def _tool(name: str) -> Callable[[list[str]], int]:
    """The ``main`` of a run that has a module of its own (imported only when asked for)."""
    if name == "hitprofile":
        from loadtest import hitprofile

        return hitprofile.main
    if name == "instructions":
        from loadtest import instructions

        return instructions.main
    if name == "soak":
        from loadtest import soak

        return soak.main
    from loadtest import stallrun

    return stallrun.main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("hitprofile", "instructions", "soak", "stall"):
        return _tool(argv[0])(argv[1:])
    args = parser().parse_args(argv)
    # Ctrl-C and SIGTERM unwind through every ``finally``, so the namespace and every
    # process are cleaned up. A shell starts background jobs with SIGINT ignored;
    # take it back, so ``kill -INT`` works there too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = Options(
        scale=args.scale, targets=args.targets, workloads=args.workloads, origin=args.origin,
        rtt_ms=args.rtt_ms, train_compute_ms=args.train_compute_ms, rate_mbit=args.rate_mbit,
        stream_mbit=args.stream_mbit, pin=not args.no_pin, seed=args.seed,
        out=args.out, keep=args.keep, phases=args.phases, wide_objects=args.wide_objects,
    )  # fmt: skip
    try:
        paths = run(options)
    except KeyboardInterrupt:
        print("interrupted: cleaned up; the partial report is in --out", file=sys.stderr)
        return 130
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main())

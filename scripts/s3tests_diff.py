#!/usr/bin/env python3
"""Ceph's S3 conformance suite run twice: straight at moto, then through Hoard in front of it.

Hoard is judged by outside S3 suites; ceph/s3-tests is the public one. A test
that passes against moto and fails through Hoard is Hoard's to explain: a bug,
or a documented, deliberate difference. A test that fails against moto says
nothing about Hoard (moto cannot do it), so the table shows both columns and
the summary counts only the Hoard-only failures.

One run starts, on loopback ports, moto's threaded server (in this process)
and one Hoard (``tests/harness.HoardProcess``, a fresh cache directory) whose
``default_origin`` passes every bucket through to that moto by name, with the
suite's main, alt and tenant keys as its credentials. The suite runs in its
own interpreter (``--python``: a virtualenv with its requirements, kept out
of Hoard's environment), once per target, each with its own config file
(``S3TEST_CONF``) and junit XML; both servers are stopped at the end.

A test whose teardown cannot empty its bucket fails the setup of the tests
after it (the suite nukes every bucket of its prefix around each test): through
Hoard, ``test_multi_object*_delete_key_limit`` leave 1001 keys behind (Hoard
refuses a 1001-key DeleteObjects, as S3 does; moto deletes them) and moto's
version listing then stops early, so those are best run on their own.

This is a tool for the lead and for triage, not part of the test suite: the
regressions it finds are pinned in ``tests/test_conformance.py`` and friends.

    python3 scripts/s3tests_diff.py /work/s3-tests -k "object_head or ranged_request"
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent

# The suite's users. moto takes any key; Hoard takes the ones in its credentials.
USERS = {
    "main": ("0555b35654ad1656d804", "h7GhxuBLTrlhVUyxSPUKUV8r/2EI4ngqJxD7iBdBYLhwluN30JaT3Q=="),
    "alt": ("NOPQRSTUVWXYZABCDEFG", "nopqrstuvwxyzabcdefghijklmnabcdefghijklm"),
    "tenant": ("HIJKLMNOPQRSTUVWXYZA", "opqrstuvwxyzabcdefghijklmnopqrstuvwxyzab"),
}
ORIGIN_KEY, ORIGIN_SECRET = "origin-access", "origin-secret"

CONF_TEMPLATE = """\
[DEFAULT]
host = 127.0.0.1
port = {port}
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = {target}-{{random}}-

[s3 main]
display_name = M. Tester
user_id = testid
email = tester@example.com
api_name = default
access_key = {main[0]}
secret_key = {main[1]}

[s3 alt]
display_name = john.doe
user_id = 56789abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234
email = john.doe@example.com
access_key = {alt[0]}
secret_key = {alt[1]}

[s3 tenant]
display_name = testx$tenanteduser
user_id = testx$9876543210abcdef0123456789abcdef0123456789abcdef0123456789abcdef
email = tenanteduser@example.com
tenant = testx
access_key = {tenant[0]}
secret_key = {tenant[1]}

[iam]
email = s3@example.com
user_id = 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
access_key = ABCDEFGHIJKLMNOPQRST
secret_key = abcdefghijklmnopqrstuvwxyzabcdefghijklmn
display_name = youruseridhere

[iam root]
access_key = AAAAAAAAAAAAAAAAAAaa
secret_key = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
user_id = RGW11111111111111111
email = account1@example.com

[iam alt root]
access_key = BBBBBBBBBBBBBBBBBBbb
secret_key = bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
user_id = RGW22222222222222222
email = account2@example.com
"""


@dataclass(frozen=True)
class Outcome:
    """One test's result on one target: passed, failed, error or skipped, and why."""

    result: str
    message: str = ""


def write_conf(workdir: Path, target: str, port: int) -> Path:
    path = workdir / f"{target}.conf"
    path.write_text(CONF_TEMPLATE.format(port=port, target=target, **USERS))
    return path


def run_suite(args: argparse.Namespace, conf: Path, junit: Path) -> None:
    """The suite's pytest for one target; its own exit status is the junit file's to tell."""
    env = {**os.environ, "S3TEST_CONF": str(conf)}
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    command = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", args.file,
               "-k", args.k, f"--junitxml={junit}"]  # fmt: skip
    with open(junit.with_suffix(".log"), "wb") as log:
        subprocess.run(command, cwd=args.suite, env=env, stdout=log, stderr=subprocess.STDOUT,
                       timeout=args.timeout, check=False)  # fmt: skip


def outcomes(junit: Path) -> dict[str, Outcome]:
    """Each test case of a junit XML file by name, with its result and first message line."""
    found: dict[str, Outcome] = {}
    if not junit.exists():
        return found
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        result, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                result = "failed" if kind == "failure" else kind
                message = (element.get("message") or "").partition("\n")[0][:160]
                break
        found[case.get("name", "?")] = Outcome(result, message)
    return found


def hoard_config(moto_endpoint: str, anonymous: bool = False) -> dict[str, object]:
    """Hoard in front of moto: every bucket passed through by name, the suite's keys."""
    return {
        "allow_anonymous": anonymous,
        "credentials": [{"access_key": key, "secret_key": secret} for key, secret in USERS.values()],
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
    }  # fmt: skip


def run_both(args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, Outcome]]:
    sys.path.insert(0, str(REPO))  # the harness that starts Hoard, from this checkout
    from moto.server import ThreadedMotoServer

    from tests.harness import HoardProcess, free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's line per request
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    hoard = None
    try:
        config = hoard_config(f"http://127.0.0.1:{moto_port}", args.anonymous)
        hoard = HoardProcess(workdir / "hoard", {**config, "workers": args.workers})
        hoard.start()
        results = {}
        for target, port in (("moto", moto_port), ("hoard", urlsplit(hoard.endpoint).port)):
            assert port is not None
            if target == "moto" and args.moto_results is not None:
                results[target] = outcomes(args.moto_results)  # an earlier run's, same -k
                continue
            junit = workdir / f"{target}.xml"
            conf = write_conf(workdir, target, port)
            print(f"running the suite against {target} (port {port}) ...", file=sys.stderr)
            run_suite(args, conf, junit)
            results[target] = outcomes(junit)
        return results
    finally:
        if hoard is not None:
            hoard.stop()
        moto.stop()


def print_table(results: dict[str, dict[str, Outcome]], verbose: bool) -> list[str]:
    """The table (every test, or only the differing ones), the counts; Hoard-only failures."""
    moto, hoard = results["moto"], results["hoard"]
    names = sorted(moto.keys() | hoard.keys())
    missing = Outcome("not run")
    width = max((len(n) for n in names), default=4)
    print(f"{'test':<{width}}  {'moto':<8}  {'hoard':<8}  hoard's message")
    hoard_only = []
    for name in names:
        on_moto, on_hoard = moto.get(name, missing), hoard.get(name, missing)
        if on_moto.result == "passed" and on_hoard.result != "passed":
            hoard_only.append(name)
        if verbose or on_moto.result != on_hoard.result:
            note = on_hoard.message if on_hoard.result != "passed" else ""
            print(f"{name:<{width}}  {on_moto.result:<8}  {on_hoard.result:<8}  {note}")
    for target, found in results.items():
        counts = Counter(outcome.result for outcome in found.values())
        print(
            f"{target}: {len(found)} run, "
            + ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
        )
    print(f"passed against moto but not through Hoard: {len(hoard_only)}")
    for name in hoard_only:
        print(f"  {name}")
    return hoard_only


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", type=Path, help="the extracted ceph/s3-tests checkout")
    parser.add_argument("-k", default="", help="pytest -k expression (default: every test)")
    parser.add_argument(
        "--file",
        default="s3tests/functional/test_s3.py",
        help="the suite's test file, relative to its checkout",
    )
    parser.add_argument(
        "--anonymous",
        action="store_true",
        help="Hoard with allow_anonymous: true (unsigned reads answered)",
    )
    parser.add_argument("--python", default="/work/s3t-venv/bin/python",
                        help="an interpreter with the suite's requirements")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="Hoard's worker processes")
    parser.add_argument(
        "--moto-results",
        type=Path,
        help="moto's junit XML of an earlier run with the same -k (not rerun)",
    )
    parser.add_argument("--out", type=Path, help="keep configs, junit XML and logs here")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per target")
    parser.add_argument("--all", action="store_true", help="list every test, not only differences")
    args = parser.parse_args()
    args.suite = args.suite.resolve()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        results = run_both(args, args.out.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="s3tests-diff-") as workdir:
            results = run_both(args, Path(workdir))
    return 1 if print_table(results, args.all) else 0


if __name__ == "__main__":
    sys.exit(main())

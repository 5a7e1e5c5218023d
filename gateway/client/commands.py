"""The client subcommands of ``hoard``: warm, warm --status, cache stats, cache drop.

Each takes parsed arguments and an ``AdminClient`` and returns the exit code:
0 when the job is done (or the call succeeded), 1 when a job failed or was
cancelled, found nothing to warm, or a call was refused. A prefix that matches
no key is almost always a typo, so a job that finished with no object is not
"done 0/0, exit 0" but a message saying nothing matched, and status 1.
``app/cli.py`` builds the client and prints refusals (with ``CREDENTIALS_HELP``
when the credentials were refused); nothing here reads the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gateway.client.admin import AdminClient
from gateway.client.progress import describe, follow

EXIT_OK = 0
EXIT_FAILED = 1
CREDENTIALS_HELP = (
    "set the key Hoard accepts as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the export "
    "lines `hoard serve` prints), or AWS_PROFILE naming a profile in ~/.aws/credentials, "
    "or pass --access-key and --secret-key"
)


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → (``bucket``, ``some/prefix``); ValueError otherwise."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"expected s3://bucket[/prefix], got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


def warm_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /_hoard/warm`` body the arguments ask for."""
    bucket, prefix = split_s3_url(args.url)
    body: dict[str, Any] = {"bucket": bucket, "pin": args.pin}
    if args.keys_from is not None:
        text = sys.stdin.read() if str(args.keys_from) == "-" else Path(args.keys_from).read_text()
        body["keys"] = [prefix + k.strip() for k in text.splitlines() if k.strip()]
    elif args.manifest is not None:
        body["manifest"] = args.manifest
    else:
        body["prefix"] = prefix
    if args.pin_ttl is not None:
        body["pin_ttl"] = args.pin_ttl
    return body


def warm(args: argparse.Namespace, client: AdminClient) -> int:
    if args.status is not None:
        status = client.call("GET", f"/_hoard/warm/{args.status}")
        print(json.dumps(status, indent=2) if args.json else describe(status))
        return EXIT_FAILED if status["state"] in ("failed", "cancelled") else EXIT_OK
    if args.url is None:
        raise ValueError("give s3://bucket/prefix to warm, or --status ID")
    job = client.call("POST", "/_hoard/warm", body=warm_body(args))
    print(f"warm job {job['id']} started (hoard warm --status {job['id']} to check it later)",
          flush=True)  # fmt: skip
    if args.no_wait:
        return EXIT_OK
    try:
        final = follow(lambda: client.call("GET", f"/_hoard/warm/{job['id']}"), time.sleep,
                       sys.stdout, args.interval)  # fmt: skip
    except KeyboardInterrupt:
        print(f"\nstopped watching; the job goes on: hoard warm --status {job['id']}")
        return 130
    print(describe(final))
    if final["state"] == "done" and final.get("objects_total") == 0:
        print(f"hoard: nothing to warm: {_nothing_matched(args)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK if final["state"] == "done" else EXIT_FAILED


def _nothing_matched(args: argparse.Namespace) -> str:
    """Why a finished job had no object, in the terms the user gave."""
    bucket, prefix = split_s3_url(args.url)
    if args.manifest is not None:
        return f"the manifest s3://{bucket}/{args.manifest} lists no key"
    if args.keys_from is not None:
        return f"{args.keys_from} lists no key"
    return (
        f"no key in bucket {bucket!r} starts with {prefix!r} (keys are case-sensitive; "
        f"`aws s3 ls s3://{bucket}/` shows what is there)"
    )


def cache(args: argparse.Namespace, client: AdminClient) -> int:
    if args.cache_command == "stats":
        print(json.dumps(client.call("GET", "/_hoard/stats"), indent=2))
        return EXIT_OK
    bucket, prefix = split_s3_url(args.url)
    dropped = client.call("DELETE", "/_hoard/cache", query={"bucket": bucket, "prefix": prefix})
    print(json.dumps(dropped))
    return EXIT_OK


def add_arguments(commands: Any) -> None:
    """The ``warm`` and ``cache`` subcommands, on ``hoard``'s subparsers."""
    warm_cmd = commands.add_parser("warm", help="preload s3://bucket/prefix into the cache")
    warm_cmd.add_argument("url", nargs="?", help="s3://bucket/prefix (keys are under it)")
    source = warm_cmd.add_mutually_exclusive_group()
    source.add_argument("--keys-from", type=Path, metavar="FILE",
                        help="warm the keys listed in FILE (one per line, '-' for stdin)")  # fmt: skip
    source.add_argument("--manifest", metavar="KEY",
                        help="warm the keys listed in this object of the bucket")  # fmt: skip
    source.add_argument("--status", metavar="ID", help="show a job's progress and exit")
    warm_cmd.add_argument("--pin", action="store_true", help="exempt warmed blocks from eviction")
    warm_cmd.add_argument("--pin-ttl", metavar="DURATION", help="how long pins last (e.g. 24h)")
    warm_cmd.add_argument("--no-wait", action="store_true", help="start the job and exit")
    warm_cmd.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    warm_cmd.add_argument("--json", action="store_true", help="with --status: raw JSON")
    _connection(warm_cmd)
    cache_cmd = commands.add_parser("cache", help="inspect or drop the cache")
    cache_commands = cache_cmd.add_subparsers(dest="cache_command", required=True)
    _connection(cache_commands.add_parser("stats", help="bytes and blocks per tier"))
    drop = cache_commands.add_parser("drop", help="drop cached data under s3://bucket/prefix")
    drop.add_argument("url", help="s3://bucket/prefix")
    _connection(drop)


def _connection(parser: argparse.ArgumentParser) -> None:
    # The variable Hoard's banner tells users to export, as every S3 client reads it.
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    parser.add_argument("--endpoint", default=endpoint, required=endpoint is None,
                        help="Hoard's URL, http://host:9000 (default: $AWS_ENDPOINT_URL)")  # fmt: skip
    parser.add_argument("--access-key", help="default: the AWS credential chain")
    parser.add_argument("--secret-key", help="default: the AWS credential chain")
    parser.add_argument("--ca-bundle", type=Path, default=os.environ.get("AWS_CA_BUNDLE") or None,
                        help="CA certificates to trust for an https:// endpoint with a private "
                             "CA (default: $AWS_CA_BUNDLE, else the system's)")  # fmt: skip

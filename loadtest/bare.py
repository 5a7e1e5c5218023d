"""``bare``: the floor of a Python hit, aiohttp + uvloop answering the same bytes from memory.

No signature, no lookup beyond one dict, no accounting: a request's path
names a file under ``--root`` (``/bucket/key``; the query is ignored), read on
its first request and kept in memory; a GET answers it whole with aiohttp's
own ``web.Response``. Whatever a Hoard hit costs above this is Hoard's own
work; whatever this costs above nginx is the price of Python's HTTP stack
(``python -m loadtest.bare --port P --root DIR``; the ``bare`` target of the
capacity workload, ``targets.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from aiohttp import web


def app(root: Path) -> web.Application:
    held: dict[str, bytes] = {}
    real_root = os.path.realpath(root)

    async def get(request: web.Request) -> web.StreamResponse:
        body = held.get(request.path)
        if body is None:
            path = os.path.realpath(os.path.join(real_root, request.path.lstrip("/")))
            if not path.startswith(real_root + os.sep) or not os.path.isfile(path):
                return web.Response(status=404)
            body = held[request.path] = Path(path).read_bytes()
        return web.Response(body=body, content_type="application/octet-stream")

    application = web.Application()
    application.router.add_get("/{tail:.*}", get)
    return application


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bare", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--root", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        print("uvloop missing: asyncio's loop serves", file=sys.stderr)
    web.run_app(app(args.root), host="127.0.0.1", port=args.port, access_log=None,
                print=None, backlog=4096)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

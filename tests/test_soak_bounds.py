"""What grows with every new key stays bounded: the soak's short mode against Hoard in-process.

Issue 34's soak (``python -m loadtest soak``) found a worker's RSS rising
~6 MiB/min under a mixed load with bounded tiers: the request-line memos
(routes, SigV4 canonical paths) kept every path they were asked, up to 65,536
each, and every fresh key or missing one is a new path; the presigned verdicts
kept every URL, up to 65,536. This runs the soak's
short mode (GETs of fresh keys, presigned) past the memos' bounds and checks
the memos, not RSS over time.

The memos are the S3 front's (the request line, the signature, the verdict),
kept before any origin is asked, so the default bounds are passed with an
origin that answers a missing key from a directory (a ``posix`` origin): the
4,296 misses cost ~3.5 ms each here, where through the counting proxy to moto
(in this process, under one GIL) they cost ~14 ms. The second test reads the
S3 origin, at a bound of its own.
"""

from __future__ import annotations

from pathlib import Path

from gateway.app.server import HIT_PATH
from gateway.core.hot_sets import HotSets
from gateway.s3 import sigv4
from gateway.s3.auth import PresignedMemo
from loadtest.soak import fresh_keys
from tests.harness import ACCESS_KEY, SECRET_KEY
from tests.inprocess import threaded_app
from tests.test_origin_protection import config


def test_fresh_keys_do_not_grow_the_request_memos_past_their_bounds(tmp_path: Path) -> None:
    root = tmp_path / "files"
    (root / "data").mkdir(parents=True)  # bucket "data": a directory, with no object in it
    settings = {"origins": {"files": {"type": "posix", "path": str(root)}},
                "default_origin": "files", "cache": {"size": "256MiB", "memory": "16MiB"}}  # fmt: skip
    with threaded_app(tmp_path, settings) as hoard:
        count = max(HotSets().urls, sigv4.CANDIDATES_KEPT) + 200
        sigv4._candidate_uris.cache_clear()
        # A space in every key: each path is escaped, so its canonical form is worked out
        # and kept (a path of plain characters is its own, and keeps nothing).
        statuses = fresh_keys(hoard.port, count, "data", ACCESS_KEY, SECRET_KEY, "fresh set/")
        assert statuses == {404: count}  # signed, checked, and missing at the origin
        front = hoard.app[HIT_PATH].front
        assert front.routes_kept <= HotSets().urls
        # Every fresh path was worked out, and only the bound's worth of them is kept.
        assert sigv4._candidate_uris.cache_info().currsize == sigv4.CANDIDATES_KEPT
        # Each fresh presigned URL is a verdict to remember: a hot set, not every URL.
        assert 0 < len(front.presigned_verdicts) <= PresignedMemo.LIMIT


def test_hit_keys_sizes_every_hot_set_of_the_hit_path(tmp_path, proxy, bucket):
    """``cache.hit_keys`` (``core/hot_sets.py``): every per-key set of the hit path is
    bounded by it, the URL-holding ones too, and fresh keys past it stay within it."""
    settings = config(proxy)
    settings["cache"]["hit_keys"] = 64
    with threaded_app(tmp_path, settings) as hoard:
        hits = hoard.app[HIT_PATH]
        front = hits.front
        assert front.hot == HotSets(64, 64)
        assert front.reader._tickets._limit == 64
        assert front.reader._first_refs_kept == 64
        assert front.presigned_verdicts._limit == 64
        statuses = fresh_keys(hoard.port, 100, bucket, ACCESS_KEY, SECRET_KEY)
        assert statuses == {404: 100}
        assert 0 < front.routes_kept <= 64
        assert 0 < len(front.presigned_verdicts) <= 64

"""What grows with every new key stays bounded: the soak's short mode against Hoard in-process.

Issue 34's soak (``python -m loadtest soak``) found a worker's RSS rising
~6 MiB/min under a mixed load with bounded tiers: the request-line memos
(routes, SigV4 canonical paths) kept every path they were asked, up to 65,536
each, and every fresh key or missing one is a new path; the presigned verdicts
kept every URL, up to 65,536. This runs the soak's
short mode (GETs of fresh keys, presigned) past the memos' bounds and checks
the memos, not RSS over time.
"""

from __future__ import annotations

from gateway.app.server import HIT_PATH
from gateway.s3 import sigv4
from gateway.s3.auth import PresignedMemo
from gateway.s3.front import ROUTES_KEPT
from loadtest.soak import fresh_keys
from tests.harness import ACCESS_KEY, SECRET_KEY
from tests.inprocess import threaded_app
from tests.test_origin_protection import config


def test_fresh_keys_do_not_grow_the_request_memos_past_their_bounds(tmp_path, proxy, bucket):
    with threaded_app(tmp_path, config(proxy)) as hoard:
        count = ROUTES_KEPT + 200
        statuses = fresh_keys(hoard.port, count, bucket, ACCESS_KEY, SECRET_KEY)
        assert statuses == {404: count}  # signed, checked, and missing at the origin
        front = hoard.app[HIT_PATH].front
        assert front.routes_kept <= ROUTES_KEPT
        assert sigv4._candidate_uris.cache_info().currsize <= sigv4.CANDIDATES_KEPT
        # Each fresh presigned URL is a verdict to remember: a hot set, not every URL.
        assert 0 < len(front.presigned_verdicts) <= PresignedMemo.LIMIT

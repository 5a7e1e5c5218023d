"""The unsigned ``/metrics`` names nothing from requests or the config.

Before, a mount's ``mount`` label was its bucket and an origin's its config name,
so anyone who could reach the port learned the buckets Hoard serves. Now mounts
are numbered by their position in ``mounts:`` (``m0``...), origins by theirs in
``origins:`` (``o0``...); passed-through buckets share ``default``.
"""

from __future__ import annotations

from pathlib import Path

import requests

from tests.inprocess import threaded_app

NAMES = ("zz-private-mount", "zz-private-folder", "zz-origin-disk", "zz-origin-other",
         "zz-passed-through", "zz-client-made-up")  # fmt: skip


def test_metrics_carry_no_bucket_mount_or_origin_name(tmp_path: Path) -> None:
    root = tmp_path / "origin"
    for folder in ("zz-private-folder", "zz-passed-through"):
        (root / folder).mkdir(parents=True)
        (root / folder / "k").write_bytes(b"x" * 100)
    config = {
        "origins": {"zz-origin-disk": {"type": "posix", "path": str(root)},
                    "zz-origin-other": {"type": "posix", "path": str(root)}},
        "default_origin": "zz-origin-other",
        "mounts": [{"bucket": "zz-private-mount", "origin": "zz-origin-disk",
                    "origin_bucket": "zz-private-folder"}],
    }  # fmt: skip
    with threaded_app(tmp_path, config) as hoard:
        client = hoard.client()
        assert client.get_object(Bucket="zz-private-mount", Key="k")["Body"].read() == b"x" * 100
        assert client.get_object(Bucket="zz-passed-through", Key="k")["Body"].read() == b"x" * 100
        client.list_objects_v2(Bucket="zz-private-mount")
        requests.get(f"{hoard.endpoint}/zz-client-made-up/k", timeout=10)  # refused: unsigned
        scrape = requests.get(f"{hoard.endpoint}/metrics", timeout=10)
    assert scrape.status_code == 200
    for name in NAMES:
        assert name not in scrape.text, name
    assert 'mount="m0"' in scrape.text and 'mount="default"' in scrape.text
    assert 'origin="o0"' in scrape.text and 'origin="o1"' in scrape.text

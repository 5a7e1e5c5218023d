"""Fill the origin (MinIO in docker-compose.yml) with a small sample dataset.

Run once by the ``loader`` service before the Hoard nodes start. It uses
botocore, which the Hoard image already has (through aiobotocore), so the
loader needs no image of its own. The data are made here, deterministically
(the same bytes on every run, so ETags are stable and a re-run changes
nothing), in the two shapes training reads:

- ``sample/train/shard-NNNNN.bin``: large shards, each spanning several cache blocks;
- ``sample/images/NNNNNN.bin``: many small files, as in an image folder;
- ``sample/labels.csv`` and ``sample/manifest.json`` (every key, size and sha256).

Settings come from the environment: ``S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``SAMPLE_BUCKET`` (``datasets``), ``SAMPLE_SHARDS`` (8),
``SAMPLE_SHARD_MIB`` (16), ``SAMPLE_SMALL_FILES`` (512).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

PREFIX = "sample/"


def make_client():
    session = botocore.session.get_session()
    return session.create_client(
        "s3",
        endpoint_url=os.environ["S3_ENDPOINT"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
    )


def dataset(shards: int, shard_mib: int, small_files: int):
    """Yield (key, body) for every object of the sample, the same bytes on every run."""
    for index in range(shards):
        key = f"{PREFIX}train/shard-{index:05d}.bin"
        yield key, random.Random(key).randbytes(shard_mib * 1024 * 1024)
    labels = ["key,label"]
    for index in range(small_files):
        key = f"{PREFIX}images/{index:06d}.bin"
        rng = random.Random(key)
        labels.append(f"{key},{rng.randrange(10)}")
        yield key, rng.randbytes(rng.randrange(2048, 16384))
    yield f"{PREFIX}labels.csv", ("\n".join(labels) + "\n").encode()


def wait_for_origin(client, attempts: int = 30) -> None:
    for attempt in range(attempts):
        try:
            client.list_buckets()
            return
        except EndpointConnectionError:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def main() -> int:
    bucket = os.environ.get("SAMPLE_BUCKET", "datasets")
    shards = int(os.environ.get("SAMPLE_SHARDS", "8"))
    shard_mib = int(os.environ.get("SAMPLE_SHARD_MIB", "16"))
    small_files = int(os.environ.get("SAMPLE_SMALL_FILES", "512"))
    client = make_client()
    wait_for_origin(client)
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    manifest: dict[str, dict[str, int | str]] = {}
    for key, body in dataset(shards, shard_mib, small_files):
        client.put_object(Bucket=bucket, Key=key, Body=body)
        manifest[key] = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    client.put_object(
        Bucket=bucket,
        Key=f"{PREFIX}manifest.json",
        Body=json.dumps(manifest, indent=1, sort_keys=True).encode(),
        ContentType="application/json",
    )
    total = sum(int(entry["size"]) for entry in manifest.values())
    print(f"loaded {len(manifest)} objects, {total / 2**20:.1f} MiB, into s3://{bucket}/{PREFIX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

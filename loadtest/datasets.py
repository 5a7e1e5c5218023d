"""Seeded datasets, written once per run to local disk (for ``static``) and the origin.

``images``: many small objects (64-256 KiB) under ~100 prefixes, as an image
dataset of one file per sample. ``shards``: a few large objects (64-256 MiB),
as tar/webdataset or parquet shards. ``rss``: one very large object per client
of the ``rss`` workload (1 GiB at full scale), made only when that workload
runs; that workload also uploads into a bucket of its own (``UPLOADS``).
``hits``: objects of exactly 128 KiB and 4 KiB (``hit_objects`` of each), the
``capacity`` workload's hits, made only when it runs; with them ``wide``:
``wide_objects`` more of 4 KiB under a prefix of their own, more objects than
any of Hoard's per-key hot sets holds (a training dataset has millions).
Contents and sizes derive from one seed, so two runs read the same bytes.
``Scale`` holds every size knob of a run.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import io
import random
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

KiB, MiB = 1024, 1024**2
BUCKET = "hoard-loadtest"
IMAGES = "images/"
SHARDS = "shards/"
RSS = "rss/"
HITS = "hits/"
HIT_SIZES = (128 * KiB, 4 * KiB)  # the capacity workload's small-hit sizes
WIDE = "wide/"  # the capacity workload's wide set: more keys than the hot sets hold
WIDE_SIZE = 4 * KiB
UPLOADS = "hoard-loadtest-uploads"  # the rss workload's upload phase writes here (a writable mount)
ORIGIN_KEY, ORIGIN_SECRET = "origin-access", "origin-secret"


@dataclass(frozen=True)
class Scale:
    name: str
    prefixes: int  # image prefixes
    per_prefix: int  # images per prefix
    image_min: int
    image_max: int
    shard_sizes: tuple[int, ...]  # the first is the largest (stream), the last two are equal (herd)
    range_size: int  # ranged-GET size of the shards workload
    readers: int  # K reader processes
    threads: int  # threads per reader
    epochs: int
    herd_clients: int
    herd_processes: int  # generator processes the herd's clients are spread over
    wrk_seconds: float
    train_batch: int
    train_compute: float  # seconds of emulated accelerator time per batch
    train_images: int  # images per reader per train epoch
    phase_timeout: float  # seconds any one (target, workload) may take
    rss_clients: int  # clients of the rss workload, each streaming its own object
    rss_size: int  # size of each of those objects
    upload_multipart: int  # rss upload phase: the multipart upload's size
    upload_part: int  # its part size
    upload_put: int  # the PutObject sent at the same time
    hit_objects: int  # capacity: objects of each size in HIT_SIZES
    wide_objects: int  # capacity: objects of WIDE_SIZE in the wide set, beyond every hot set
    wrk_repeats: int  # capacity: wrk runs per phase (medians are reported)
    # herd: seconds from handing out a phase's tasks to the moment every client starts
    # (a barrier across the generator processes, which are warm by then)
    herd_barrier: float = 1.0

    def describe(self) -> dict[str, object]:
        return asdict(self)


QUICK = Scale(
    name="quick", prefixes=4, per_prefix=6, image_min=64 * KiB, image_max=256 * KiB,
    shard_sizes=(4 * MiB, 2 * MiB, 2 * MiB), range_size=1 * MiB, readers=2, threads=4,
    epochs=3, herd_clients=64, herd_processes=2, wrk_seconds=1.0, train_batch=4,
    train_compute=0.005, train_images=12, phase_timeout=60, rss_clients=8, rss_size=32 * MiB,
    upload_multipart=64 * MiB, upload_part=16 * MiB, upload_put=32 * MiB, hit_objects=48,
    wide_objects=300, wrk_repeats=1,
)  # fmt: skip

SCALES = {
    "quick": QUICK,
    # tests/test_loadtest_smoke.py's: every workload on every target, at sizes that only
    # have to give numbers (not figures to read): quick's shape (multi-block rss objects,
    # a four-part multipart upload) with fewer, smaller objects and clients, and a
    # shorter herd barrier.
    "smoke": dataclasses.replace(
        QUICK, name="smoke", prefixes=2, image_min=16 * KiB, image_max=64 * KiB,
        shard_sizes=(2 * MiB, 1 * MiB, 1 * MiB), range_size=512 * KiB, herd_clients=16,
        train_images=6, rss_size=16 * MiB, upload_multipart=20 * MiB, upload_part=5 * MiB,
        upload_put=8 * MiB, hit_objects=16, wide_objects=64, herd_barrier=0.25,
    ),
    "full": Scale(
        name="full", prefixes=100, per_prefix=30, image_min=64 * KiB, image_max=256 * KiB,
        shard_sizes=(256 * MiB, 128 * MiB, 64 * MiB, 64 * MiB), range_size=8 * MiB, readers=2,
        threads=8, epochs=3, herd_clients=64, herd_processes=4, wrk_seconds=10.0, train_batch=32,
        train_compute=0.1, train_images=640, phase_timeout=600, rss_clients=8,
        rss_size=1024 * MiB, upload_multipart=5 * 1024 * MiB, upload_part=64 * MiB,
        upload_put=2 * 1024 * MiB, hit_objects=2000, wide_objects=50_000,
        wrk_repeats=3,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Obj:
    key: str
    size: int


@dataclass(frozen=True)
class Dataset:
    """What was written: every key and size, and where the local copy lives."""

    bucket: str
    images: tuple[Obj, ...]
    shards: tuple[Obj, ...]
    local_root: Path  # local_root / bucket / key is the file
    rss: tuple[Obj, ...] = ()  # only when the rss workload runs
    hits: tuple[Obj, ...] = ()  # only when the capacity workload runs
    wide: tuple[Obj, ...] = ()  # the same

    def hits_of(self, size: int) -> tuple[Obj, ...]:
        return tuple(o for o in self.hits if o.size == size)

    @property
    def stream_object(self) -> Obj:
        return self.shards[0]

    @property
    def herd_object(self) -> Obj:
        return self.shards[-1]

    @property
    def alone_object(self) -> Obj:
        """Same size as ``herd_object``, read by one client as the herd's baseline."""
        return self.shards[-2]

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in (*self.images, *self.shards, *self.rss, *self.hits, *self.wide))

    def summary(self) -> dict[str, object]:
        summary: dict[str, object] = {
            "bucket": self.bucket,
            "images": len(self.images),
            "images_bytes": sum(o.size for o in self.images),
            "shards": [o.size for o in self.shards],
            "shards_bytes": sum(o.size for o in self.shards),
        }
        if self.hits:
            summary["hits"] = " + ".join(
                f"{len(self.hits_of(size))} x {size // KiB} KiB" for size in HIT_SIZES
            )
        if self.wide:
            summary["wide"] = f"{len(self.wide)} x {WIDE_SIZE // KiB} KiB"
        if self.rss:
            summary["rss"] = f"{len(self.rss)} x {self.rss[0].size / MiB:g} MiB"
        return summary


def plan(scale: Scale, seed: int, rss: bool = False, hits: bool = False) -> Dataset:
    """Keys and sizes only (no bytes yet): deterministic in ``seed``; ``rss`` and ``hits``
    objects if asked."""
    rng = random.Random(seed)
    images = tuple(
        Obj(f"{IMAGES}p{p:03d}/img{i:05d}.jpg", rng.randint(scale.image_min, scale.image_max))
        for p in range(scale.prefixes)
        for i in range(scale.per_prefix)
    )
    shards = tuple(
        Obj(f"{SHARDS}shard-{n:03d}.tar", size) for n, size in enumerate(scale.shard_sizes)
    )
    big = tuple(
        Obj(f"{RSS}object-{n:03d}.bin", scale.rss_size)
        for n in range(scale.rss_clients if rss else 0)
    )
    fixed = tuple(
        Obj(f"{HITS}{size // KiB}k/obj{i:05d}.bin", size)
        for size in (HIT_SIZES if hits else ())
        for i in range(scale.hit_objects)
    )
    wide = tuple(
        Obj(f"{WIDE}{WIDE_SIZE // KiB}k/obj{i:06d}.bin", WIDE_SIZE)
        for i in range(scale.wide_objects if hits else 0)
    )
    return Dataset(BUCKET, images, shards, Path(), big, fixed, wide)


class Synthetic(io.RawIOBase):
    """The bytes of one ``rss`` object, made as they are read (never held whole).

    Seeded and cheap (a GiB in well under a second, where ``randbytes`` takes
    seconds): one 8 MiB random block per object, rotated by a different offset
    for every 8 MiB, so no two blocks of a cache are the same.
    """

    STEP = 8 * MiB

    def __init__(self, key: str, size: int, seed: int) -> None:
        super().__init__()
        self.base = random.Random(f"{seed}:{key}").randbytes(self.STEP)
        self.size = size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = min(len(buffer), self.size - self.pos)
        if left <= 0:
            return 0
        index, offset = divmod(self.pos, self.STEP)
        shift = (offset + index * 1_048_583) % self.STEP
        n = min(left, self.STEP - offset, self.STEP - shift)
        buffer[:n] = self.base[shift : shift + n]
        self.pos += n
        return n


def write_local(dataset: Dataset, root: Path, seed: int, rss: bool = False) -> Dataset:
    """Write every object under ``root/bucket/`` (the ``rss`` ones if asked); sets ``local_root``."""
    every = (*dataset.images, *dataset.hits, *dataset.wide, *dataset.shards)
    for obj in (*every, *(dataset.rss if rss else ())):
        path = root / dataset.bucket / obj.key
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size == obj.size:
            continue
        with open(path, "wb") as handle:
            if obj.key.startswith(RSS):
                shutil.copyfileobj(Synthetic(obj.key, obj.size, seed), handle, 8 * MiB)
                continue
            rng = random.Random(f"{seed}:{obj.key}")
            left = obj.size
            while left > 0:  # bounded: size / 8 MiB iterations
                step = min(left, 8 * MiB)
                handle.write(rng.randbytes(step))
                left -= step
    return dataclasses.replace(dataset, local_root=root)


def origin_client(endpoint: str, pool: int = 16):
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=ORIGIN_KEY, aws_secret_access_key=ORIGIN_SECRET,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=pool,
                      retries={"max_attempts": 3, "mode": "standard"}),
    )  # fmt: skip


def put_plain(moto_url: str, dataset: Dataset, obj: Obj) -> None:
    """A PutObject of a small file with the headers boto3 sends for one (its CRC32 and
    payload hash), over plain HTTP: for the wide set, which moto's fast lane stores
    without its dispatch (``motofast.py``), and boto3 would cost more than moto then."""
    body = (dataset.local_root / dataset.bucket / obj.key).read_bytes()
    headers = {
        # moto checks no signature; one is sent as boto3 sends it (the key names the account)
        "Authorization": f"AWS4-HMAC-SHA256 Credential={ORIGIN_KEY}/20260101/us-east-1/s3/"
                         "aws4_request, SignedHeaders=host, Signature=0",
        "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
        "x-amz-sdk-checksum-algorithm": "CRC32",
        "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode(),
    }  # fmt: skip
    parts = urlsplit(moto_url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        connection.request("PUT", f"/{dataset.bucket}/{quote(obj.key)}", body, headers)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"PUT {obj.key}: HTTP {response.status}")
    finally:
        connection.close()


def seed_origin(dataset: Dataset, moto_url: str, seed: int) -> None:
    """Upload the dataset to the origin (moto directly, not through the counting proxy).

    Images and shards come from the local copy; ``rss`` objects are made as they are sent.
    """
    client = origin_client(moto_url)
    client.create_bucket(Bucket=dataset.bucket)
    client.create_bucket(Bucket=UPLOADS)  # Hoard mounts it; the rss workload uploads into it

    def put(obj: Obj) -> None:
        client.upload_file(
            str(dataset.local_root / dataset.bucket / obj.key), dataset.bucket, obj.key,
            Config=TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                                  max_concurrency=4),
        )  # fmt: skip

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, (*dataset.images, *dataset.hits)))
    with ThreadPoolExecutor(8) as pool:  # moto answers these itself: a few threads keep it busy
        list(pool.map(lambda o: put_plain(moto_url, dataset, o), dataset.wide))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(put, dataset.shards))

    def stream(obj: Obj) -> None:
        # Made as they are sent. A composite checksum (CRC32 per part) lets moto complete
        # the upload without joining the parts in memory (see motoserver.py).
        client.upload_fileobj(
            io.BufferedReader(Synthetic(obj.key, obj.size, seed), 8 * MiB), dataset.bucket,
            obj.key, ExtraArgs={"ChecksumAlgorithm": "CRC32"},
            Config=TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                                  max_concurrency=4),
        )  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(stream, dataset.rss))

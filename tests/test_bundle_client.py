"""Hoard's own batch GET clients: ``gateway.client.bundle`` and the torch ``BundleDataset``.

In-process Hoard with moto behind it; the dataset runs in a real ``DataLoader``
with two worker processes and a batch sampler, and each batch must be one
bundle request (``hoard_bundles_total``), no GET.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from gateway.client.bundle import BundleClient, BundleError, bundle
from gateway.client.torch import BundleDataset
from tests.conftest import seed
from tests.harness import ACCESS_KEY, SECRET_KEY, metric
from tests.inprocess import threaded_app
from tests.origin_proxy import OriginProxy
from tests.test_bundle import body_of, config

CREDENTIALS = {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
               "region_name": "us-east-1"}  # fmt: skip


@pytest.fixture
def data(bucket: str) -> dict[str, bytes]:
    objects = {f"train/{i:04d}.jpg": body_of(str(i), 500 + 37 * i) for i in range(50)}
    seed(bucket, objects)
    return objects


def test_the_plain_iterator_yields_keys_in_order(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    keys = [*sorted(data)[::-1][:20], "train/0003.jpg"]
    with threaded_app(tmp_path, config(proxy)) as hoard:
        got = list(bundle(bucket, keys, hoard.endpoint, **CREDENTIALS))
        assert got == [(key, data[key]) for key in keys]
        with pytest.raises(BundleError) as caught:
            list(bundle(bucket, ["train/0001.jpg", "nope"], hoard.endpoint, **CREDENTIALS))
        assert (caught.value.status, caught.value.code) == (404, "BundleKeyNotFound")
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        assert list(client.bundle(bucket, ["nope", "train/0002.jpg"], on_error="skip")) == [
            ("train/0002.jpg", data["train/0002.jpg"])]  # fmt: skip
        assert client.skipped == [{"key": "nope", "reason": "NoSuchKey"}]
        # The pool's connection is reused once an archive was read whole.
        for _ in range(3):
            assert len(list(client.bundle(bucket, keys))) == len(keys)
        client.close()


def test_large_objects_among_small_ones_come_whole(tmp_path: Path, proxy: OriginProxy, bucket: str):
    # Multi-block objects (64 KiB blocks), each read past the client's buffer at once.
    objects = {f"k/{i}": body_of(str(i), size)
               for i, size in enumerate([200_000, 17, 70_000, 0, 131_072, 40_000])}  # fmt: skip
    seed(bucket, objects)
    cfg = config(proxy)
    with threaded_app(tmp_path, cfg) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        for _ in range(2):  # cold, then warm
            assert list(client.bundle(bucket, list(objects))) == list(objects.items())
        client.close()


def _sized(key: str, data: bytes) -> tuple[str, int]:
    return key, len(data)


def test_bundle_dataset_in_a_data_loader_with_two_workers(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    with threaded_app(tmp_path, config(proxy)) as hoard:
        dataset = BundleDataset.from_prefix(bucket, "train/", hoard.endpoint, **CREDENTIALS)
        assert dataset.keys == sorted(data)
        assert dataset[7] == ("train/0007.jpg", data["train/0007.jpg"])  # alone, in this process
        copy = pickle.loads(pickle.dumps(dataset))
        assert copy[3] == ("train/0003.jpg", data["train/0003.jpg"])
        sampler = BatchSampler(SequentialSampler(dataset), batch_size=8, drop_last=False)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=list)
        before = metric(hoard.endpoint, "hoard_bundles_total")
        batches = list(loader)
        assert [item for batch in batches for item in batch] == sorted(data.items())
        assert metric(hoard.endpoint, "hoard_bundles_total") - before == len(batches) == 7
        assert metric(hoard.endpoint, 'hoard_requests_total{operation="GetObject"}') == 0
        sized = BundleDataset(bucket, sorted(data)[:4], hoard.endpoint, _sized, **CREDENTIALS)
        loader = DataLoader(sized, batch_size=2, num_workers=2, collate_fn=list)
        assert [item for batch in loader for item in batch] == [
            (key, len(data[key])) for key in sorted(data)[:4]]  # fmt: skip

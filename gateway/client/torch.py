"""``BundleDataset``: a map-style torch ``Dataset`` whose every batch is one batch GET.

PyTorch's ``DataLoader`` fetches a map-style dataset's batch with
``dataset.__getitems__(indices)`` when the dataset has one (auto-collation:
a ``batch_size`` or a ``batch_sampler``), so a batch of 64 or 1,024 samples
becomes one ``POST ?bundle`` to Hoard instead of as many GETs: the
per-request work on both sides is paid once per batch. ``__getitem__(i)``
alone works too (a bundle of one). Items are ``(key, bytes)``, or whatever
``transform(key, bytes)`` makes of them; the default collate function does
not know ``bytes``, so give the loader ``collate_fn=list`` (or a transform
that makes tensors).

Workers: the dataset is pickled into each ``DataLoader`` worker; the
connection pool (``client/bundle.py``'s ``BundleClient``) is not part of it,
and is made in each process at its first batch. ``from_prefix`` lists a
prefix once (the listing Hoard answers from its metadata cache).

Torch is an optional dependency (``pip install hoard[torch]``); nothing else
in Hoard imports this module. Not done: registering each epoch's order with
epoch-order prefetch. A bundle already asks for the whole batch at once, and
the keys of a batch are opened ahead on the server, so the next batch's
prefetch buys less than it does for single GETs; a sampler that knows its
epoch's order can still call ``gateway.client.prefetch`` itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from gateway.client.bundle import BundleClient, s3_client

Transform = Callable[[str, bytes], Any]


class BundleDataset(Dataset):
    """The objects ``keys`` of ``bucket``, fetched a batch per request."""

    def __init__(self, bucket: str, keys: Sequence[str], endpoint: str | None = None,
                 transform: Transform | None = None, **credentials: Any) -> None:  # fmt: skip
        """``credentials``: boto3.Session's arguments; else boto3's chain finds them."""
        self.bucket = bucket
        self.keys = list(keys)
        self.endpoint = endpoint
        self.transform = transform
        self._credentials = credentials
        self._client: BundleClient | None = None
        self._pid = 0

    @classmethod
    def from_prefix(cls, bucket: str, prefix: str = "", endpoint: str | None = None,
                    transform: Transform | None = None, **credentials: Any) -> BundleDataset:  # fmt: skip
        """Every key under ``prefix``, in listing order, from one listing."""
        client = s3_client(endpoint, **credentials)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [entry["Key"] for page in pages for entry in page.get("Contents", [])]
        return cls(bucket, keys, endpoint, transform, **credentials)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        wanted = [self.keys[i] for i in indices]
        got = list(self._bundles().bundle(self.bucket, wanted))
        if [key for key, _ in got] != wanted:  # fail mode answers all or nothing
            raise RuntimeError(f"bundle answered {len(got)} of {len(wanted)} keys")
        if self.transform is None:
            return got
        return [self.transform(key, data) for key, data in got]

    def _bundles(self) -> BundleClient:
        """This process's client: made at its first batch (a worker's own, after fork)."""
        if self._client is None or self._pid != os.getpid():
            self._client = BundleClient(self.endpoint, **self._credentials)
            self._pid = os.getpid()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"], state["_pid"] = None, 0  # a pool does not cross processes
        return state

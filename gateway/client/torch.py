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

Workers: the dataset's ``BundleClient`` (``client/bundle.py``) is made where
the dataset is, once: the credential chain walked, the region and endpoint
found, the signer made. A ``DataLoader`` worker made by ``fork`` (Linux's
default) inherits it and opens only connections of its own, so a worker
costs no botocore session at each epoch's start (about 20 ms of CPU each, as
much as a thousand 112 KiB samples' reading). A dataset pickled instead
(``spawn``, ``forkserver``) travels without its client, and makes one in the
worker at its first batch. ``from_prefix`` lists a prefix once (the listing
Hoard answers from its metadata cache).

Torch is an optional dependency (``pip install hoard[torch]``); nothing else
in Hoard imports this module. Not done: registering each epoch's order with
epoch-order prefetch. A bundle already asks for the whole batch at once, and
the keys of a batch are opened ahead on the server, so the next batch's
prefetch buys less than it does for single GETs; a sampler that knows its
epoch's order can still call ``gateway.client.prefetch`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from gateway.client.bundle import BundleClient, s3_client

Transform = Callable[[str, bytes], Any]


def _pair(key: str, data: bytes) -> tuple[str, bytes]:
    return key, data


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
        self._client: BundleClient | None = BundleClient(endpoint, **credentials)

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
        transform = self.transform or _pair
        got, items = [], []
        # Each sample transformed as it arrives: what a transform makes smaller (decoded,
        # resized), the batch holds as that, not as the bytes of all of its samples at once
        # (fresh memory a batch, as many page faults as pages in a worker whose heap shrank).
        for key, data in self._bundles().bundle(self.bucket, wanted):
            got.append(key)
            items.append(transform(key, data))
        if got != wanted:  # fail mode answers all or nothing
            raise RuntimeError(f"bundle answered {len(got)} of {len(wanted)} keys")
        return items

    def _bundles(self) -> BundleClient:
        """The client: the one made with the dataset (its connections per process), or,
        in a process the dataset was pickled into, one made at its first batch."""
        if self._client is None:
            self._client = BundleClient(self.endpoint, **self._credentials)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # connections, a session's refreshers: made where it lands
        return state

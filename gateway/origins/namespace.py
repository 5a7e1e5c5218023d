"""One bucket namespace over several origins.

A *mount* maps a gateway bucket (what clients see) onto an origin, a bucket of
that origin and a key prefix inside it, with a policy (metadata TTLs,
read-only, write-through). With a ``default_origin``, a bucket that is not
mounted passes through by its own name, so a user who only changes
``AWS_ENDPOINT_URL`` sees their usual buckets.

Keys are translated here and only here: ``origin_key`` adds the mount prefix,
``client_key`` strips it. Nothing below knows a gateway bucket name; nothing
above knows an origin prefix.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.config.settings import PosixOriginConfig, Settings
from gateway.core import errors
from gateway.core.invalidation import Invalidation
from gateway.origins.base import BucketInfo, ListPage, Origin

# The metric label shared by buckets that no mount names (passed through or unknown).
PASSTHROUGH_LABEL = "default"


def mount_label(index: int) -> str:
    """The ``mount`` metric label of the ``index``-th entry of ``mounts:``: its position,
    never its bucket name (``/metrics`` is unsigned; a bucket's name can be a secret)."""
    return f"m{index}"


@dataclass(frozen=True, slots=True)
class Mount:
    """Where one gateway bucket lives, and the rules it is served under."""

    bucket: str
    origin: Origin
    origin_bucket: str
    prefix: str = ""
    metadata_ttl: float = 60.0
    negative_ttl: float = 10.0
    readonly: bool = False
    # Largest object whose bytes a PutObject also puts in the block cache; 0: none.
    write_through_max: int = 64 * 1024 * 1024
    mounted: bool = True  # False for a bucket passed through by default_origin
    label: str = PASSTHROUGH_LABEL  # its ``mount`` metric label (``Namespace`` numbers mounts)

    def origin_key(self, key: str) -> str:
        return self.prefix + key

    def client_key(self, origin_key: str) -> str:
        return origin_key[len(self.prefix) :]

    def invalidation(self, key: str | None, *, prefix: str = "") -> Invalidation:
        """A change of the client's ``key``, or (None) of everything under ``prefix``,
        in origin terms: what every tier and every node is told."""
        if key is None:
            return Invalidation(
                self.origin.name, self.origin_bucket, prefix=self.origin_key(prefix)
            )
        return Invalidation(self.origin.name, self.origin_bucket, key=self.origin_key(key))

    def origin_query(
        self, prefix: str, delimiter: str, start_after: str, max_keys: int
    ) -> tuple[str, str, str, int]:
        """A listing query in the origin's terms (the mount's prefix added)."""
        after = self.origin_key(start_after) if start_after else ""
        return self.origin_key(prefix), delimiter, after, max_keys

    def client_page(self, page: ListPage) -> ListPage:
        """An origin listing page in the mount's client keys."""
        return ListPage(
            entries=[dataclasses.replace(e, key=self.client_key(e.key)) for e in page.entries],
            common_prefixes=[self.client_key(p) for p in page.common_prefixes],
            is_truncated=page.is_truncated,
            next_marker=self.client_key(page.next_marker) if page.next_marker else None,
        )


class Namespace:
    """Resolves gateway bucket names to mounts."""

    def __init__(
        self,
        mounts: list[Mount],
        default_origin: Origin | None = None,
        *,
        write_through_max: int = 64 * 1024 * 1024,
        write_through_buffer: int = 256 * 1024 * 1024,
        default_ttls: tuple[float, float] = (60.0, 10.0),
    ) -> None:
        """``default_ttls``: (metadata, negative) TTLs of buckets passed through."""
        self._mounts = {
            mount.bucket: dataclasses.replace(mount, label=mount_label(index))
            for index, mount in enumerate(mounts)
        }
        self._default_origin = default_origin
        self._default_ttls = default_ttls
        self._write_through_max = write_through_max  # for buckets passed through
        # Bytes of uploads held in memory for write-through at once (the writer's budget).
        self.write_through_buffer = write_through_buffer
        self._started = datetime.now(UTC).replace(microsecond=0)

    @classmethod
    def from_settings(cls, settings: Settings, origins: dict[str, Origin]) -> Namespace:
        mounts = []
        for cfg in settings.mounts:
            is_posix = isinstance(settings.origins[cfg.origin], PosixOriginConfig)
            # A posix mount without origin_bucket addresses the origin's root directory.
            origin_bucket = cfg.origin_bucket or ("" if is_posix else cfg.bucket)
            mounts.append(
                Mount(
                    bucket=cfg.bucket,
                    origin=origins[cfg.origin],
                    origin_bucket=origin_bucket,
                    prefix=cfg.prefix,
                    metadata_ttl=cfg.metadata_ttl,
                    negative_ttl=cfg.negative_ttl,
                    readonly=cfg.readonly,
                    write_through_max=settings.cache.write_through_max if cfg.write_through else 0,
                )
            )
        default = origins[settings.default_origin] if settings.default_origin else None
        return cls(
            mounts,
            default,
            write_through_max=settings.cache.write_through_max,
            write_through_buffer=settings.cache.write_through_buffer,
            default_ttls=(settings.default_metadata_ttl, settings.default_negative_ttl),
        )

    def resolve(self, bucket: str) -> Mount:
        """The mount serving ``bucket``; ``NoSuchBucket`` if there is none."""
        mount = self._mounts.get(bucket)
        if mount is not None:
            return mount
        if self._default_origin is None or not bucket:
            raise errors.NoSuchBucket(bucket)
        return Mount(
            bucket=bucket,
            origin=self._default_origin,
            origin_bucket=bucket,
            metadata_ttl=self._default_ttls[0],
            negative_ttl=self._default_ttls[1],
            write_through_max=self._write_through_max,
            mounted=False,
        )

    def label(self, bucket: str) -> str:
        """The ``mount`` metric label of a request for ``bucket``: never a bucket's name.

        A configured mount is named by its position in ``mounts:`` (``m0``, ``m1``...);
        every other bucket shares ``PASSTHROUGH_LABEL`` (there may be any number of
        them); no bucket: empty.
        """
        mount = self._mounts.get(bucket)
        if mount is not None:
            return mount.label
        return PASSTHROUGH_LABEL if bucket else ""

    def labels(self) -> list[str]:
        """Every ``mount`` label value this namespace can give a request for a bucket."""
        return [m.label for m in self._mounts.values()] + (
            [PASSTHROUGH_LABEL] if self._default_origin else []
        )

    def mounts(self) -> list[Mount]:
        return list(self._mounts.values())

    def origins(self) -> list[Origin]:
        """Every distinct origin, each once (for start-up and shutdown)."""
        seen: dict[int, Origin] = {}
        for origin in [m.origin for m in self._mounts.values()] + [self._default_origin]:
            if origin is not None:
                seen.setdefault(id(origin), origin)
        return list(seen.values())

    async def list_buckets(self) -> list[BucketInfo]:
        """Mounted buckets plus, with a default origin, the origin's own buckets."""
        passthrough: list[BucketInfo] = []
        if self._default_origin is not None:
            passthrough = await self._default_origin.list_buckets()
        created = await self._mount_creation_dates()
        listed = {b.name: b for b in passthrough if b.name not in self._mounts}
        for name in self._mounts:
            listed[name] = BucketInfo(name, created.get(name, self._started))
        return sorted(listed.values(), key=lambda b: b.name)

    async def _mount_creation_dates(self) -> dict[str, datetime]:
        """A mount shows its origin bucket's creation date when the origin knows it."""
        by_origin: dict[int, list[Mount]] = {}
        for mount in self._mounts.values():
            by_origin.setdefault(id(mount.origin), []).append(mount)

        async def dates_of(mounts: list[Mount]) -> dict[str, datetime]:
            try:
                buckets = {b.name: b.created for b in await mounts[0].origin.list_buckets()}
            except errors.HoardError:
                return {}
            return {
                m.bucket: buckets[m.origin_bucket] for m in mounts if m.origin_bucket in buckets
            }

        found: dict[str, datetime] = {}
        for dates in await asyncio.gather(*(dates_of(ms) for ms in by_origin.values())):
            found.update(dates)
        return found

"""The config contract: one settings object, its models and their defaults.

The models here are the whole contract: every key, its type and default,
validated strictly (unknown keys are an error). Quantities are
``config_units.py``'s (sizes such as ``8MiB``; durations ``30s``/``5m``/``1h``/
``forever``); reading a file, ``${VAR}`` references and ``HOARD_...``
environment overrides are ``config_load.py``'s, whose ``load_settings`` is the
only entry point. A bad config raises ``ConfigError`` whose message is one line
per problem, each naming the key, so ``app/cli.py`` can print it and exit 2 without
a traceback.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.config.units import Duration, Size, Umask, parse_size

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """A config problem; ``str()`` is one line per problem, each naming its key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hoard"


# What one object's metadata takes in memory, as measured (python -m loadtest.metamem):
# the deprecated entry-count bounds are multiplied by these to become bytes.
HEAD_BYTES = 256
LISTED_KEY_BYTES = 96
_DEPRECATED_AS = {"metadata_entries": f"{HEAD_BYTES} x entries",
                  "listing_keys": f"{LISTED_KEY_BYTES} x keys",
                  "whole_listing_limit": f"{LISTED_KEY_BYTES} x keys"}  # fmt: skip


class CacheConfig(_Strict):
    dir: Path = Field(default_factory=_default_cache_dir)
    # The process umask: cached blocks, metadata and job files of private objects are
    # 0600 in 0700 directories by default; 027 lets a group read a shared cache.
    umask: Umask = 0o077
    size: Size = parse_size("10GiB")
    memory: Size = parse_size("512MiB")
    block_size: Size = parse_size("8MiB")
    # Blocks fetched ahead of a reader (in parallel) within and after its range.
    read_ahead: int = Field(default=4, ge=0, le=64)
    # The read-ahead window of a sequential stream grows (doubling) up to this many blocks
    # while the reader catches up with its fills, and falls back to read_ahead when the
    # stream goes random or stays idle for read_ahead_idle (gateway/readahead.py).
    read_ahead_max: int = Field(default=16, ge=0, le=256)
    read_ahead_idle: Duration = 10.0
    # Disk admission: "always" writes every filled block; "second_hit" writes a block only
    # when it is missed again within the last admission_window distinct missed blocks, so
    # one pass over a huge cold dataset does not flush the hot set (gateway/cache/admission.py).
    admission: Literal["always", "second_hit"] = "always"
    admission_window: int = Field(default=1_000_000, ge=1, le=1_000_000_000)
    # Concurrent block fills per worker; each holds up to one block in memory.
    fill_concurrency: int = Field(default=16, ge=1, le=1024)
    # Largest block the memory tier keeps; bigger ones are served from disk with sendfile.
    memory_item_max: Size = parse_size("1MiB")
    # Largest block the memory tier keeps when it is on disk too: above it a hit sent
    # with sendfile from the disk copy costs less CPU than a copy out of memory.
    memory_item_max_on_disk: Size = parse_size("64KiB")
    # fsync block files before they become visible (a crash otherwise costs a refetch).
    fsync: bool = False
    # Descriptors of hot disk blocks up to 1 MiB kept open per worker, so a hit needs no
    # open, header check or thread hop (gateway/cache/disk_open.py); 0 turns it off.
    open_files: int = Field(default=4096, ge=0, le=1_000_000)
    # Keys whose hit state a worker keeps: a presigned URL's verdict and route, the key's
    # lookups, its rendered headers (gateway/core/hot_sets.py). Unset: 4,096 URLs and
    # 16,384 keys. A dataset read every epoch that fits stays as cheap as a few hot keys
    # (at 20,000 keys past the defaults a 4 KiB hit cost ~3x the CPU); ~3-4 KB a key.
    hit_keys: int | None = Field(default=None, ge=1, le=100_000_000)
    # Blocks up to packed_block_max bytes are appended to shared segment files of up to
    # segment_size bytes instead of one file each (gateway/cache/disk_packed.py); 0: off.
    packed_block_max: Size = parse_size("256KiB")
    segment_size: Size = parse_size("64MiB")
    # Memory for metadata per worker, half for HEAD answers (~230 bytes an object,
    # packed) and half for listings (~85 bytes a key, a prefix's whole listing kept
    # as one columnar snapshot while it fits in that half; bigger prefixes are cached
    # page by page; an eighth of that half holds rendered pages). The default holds
    # ~2.3 M objects' heads and ~5.5 M listed keys.
    metadata_memory: Size = parse_size("1GiB")
    # Rows of the node's on-disk metadata store (~200 bytes of disk each).
    metadata_store_rows: int = Field(default=10_000_000, ge=1)
    # Deprecated entry-count bounds, still accepted: each is turned into bytes
    # (metadata_head_bytes and friends below), so old configs keep their meaning.
    metadata_entries: int | None = Field(default=None, ge=1)
    listing_keys: int | None = Field(default=None, ge=1)
    whole_listing_limit: int | None = Field(default=None, ge=1)
    # Write-through: a PutObject up to this size also lands in the block cache (mounts
    # opt out with write_through: false), holding at most write_through_buffer bytes of
    # uploads in memory at once per worker; an upload that finds no room is not cached.
    write_through_max: Size = parse_size("64MiB")
    write_through_buffer: Size = parse_size("256MiB")
    # Bytes of the disk tier that warm jobs may pin (exempt from eviction); unset: half
    # of cache.size, so read-through caching always keeps the other half to work in.
    pin_quota: Size | None = None

    @property
    def metadata_head_bytes(self) -> int:
        """Bytes for HEAD answers: half of ``metadata_memory``, or the old entry count's worth."""
        if self.metadata_entries is not None:
            return self.metadata_entries * HEAD_BYTES
        return self.metadata_memory // 2

    @property
    def metadata_listing_bytes(self) -> int:
        """Bytes for listings: half of ``metadata_memory``, or the old key count's worth."""
        if self.listing_keys is not None:
            return self.listing_keys * LISTED_KEY_BYTES
        return self.metadata_memory - self.metadata_memory // 2

    @property
    def whole_listing_bytes(self) -> int:
        """The largest prefix snapshot: all the listings' bytes, or the old key count's worth."""
        if self.whole_listing_limit is not None:
            return self.whole_listing_limit * LISTED_KEY_BYTES
        return self.metadata_listing_bytes

    @property
    def pin_limit(self) -> int:
        """The pin quota in bytes: ``pin_quota``, or half the disk tier when unset."""
        return self.size // 2 if self.pin_quota is None else self.pin_quota

    @model_validator(mode="after")
    def _deprecated_counts(self) -> CacheConfig:
        for name in ("metadata_entries", "listing_keys", "whole_listing_limit"):
            if name in self.model_fields_set:
                log.warning("cache.%s is deprecated: set cache.metadata_memory (bytes) instead; "
                            "%s is taken as %s bytes", name, name, _DEPRECATED_AS[name])  # fmt: skip
        return self

    @model_validator(mode="after")
    def _read_ahead_bounds(self) -> CacheConfig:
        if self.read_ahead_max < self.read_ahead:
            raise ValueError("read_ahead_max must be at least read_ahead")
        return self

    @field_validator("block_size")
    @classmethod
    def _block_size_sane(cls, value: int) -> int:
        if not 64 * 1024 <= value <= 1024**3:
            raise ValueError("block_size must be between 64KiB and 1GiB")
        return value


class WarmConfig(_Strict):
    # Blocks one warm job fetches at once on a node (each is one origin GET in flight).
    concurrency: int = Field(default=8, ge=1, le=256)
    # Warm jobs (or a cluster job's shares) running at once on a node; more wait, queued.
    max_running: int = Field(default=2, ge=1, le=64)
    # Finished jobs whose records are kept (oldest removed first).
    history: int = Field(default=100, ge=1)
    # How long a GET of a cluster job waits for each other node's progress.
    poll_timeout: Duration = 2.0
    # Auto-warm (warm/auto.py): once this many reads of objects under a prefix a client
    # listed went to the origin (and at least 1 in 1,000 of the objects listed there),
    # the rest of that prefix is warmed by a job. 0 turns it off.
    auto_after: int = Field(default=16, ge=0)
    # ... if the bytes it lists fit in this share of the disk cache (more would be
    # evicted by the job itself before the reader, in its own order, came to them).
    auto_max_share: float = Field(default=0.5, gt=0, le=1)


def _a_secret(value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
    """An empty or blank secret guards nothing, wherever Hoard listens: refused at start
    and on reload alike (``safety.py`` judges the rest only off loopback)."""
    if value is not None and not value.get_secret_value().strip():
        key = info.data.get("access_key")
        whose = f" (key {key!r})" if key else ""
        raise ValueError(f"is empty or whitespace{whose}: a secret must not be")
    return value


class Credential(_Strict):
    access_key: str = Field(min_length=1)
    secret_key: SecretStr
    buckets: list[str] | None = None
    readonly: bool = False

    _secret_key_set = field_validator("secret_key")(_a_secret)


class LimitsConfig(_Strict):
    """How hard Hoard may press one origin (``origins/guard.py``); 0 means unlimited."""

    # Requests in flight at once (a GET until its body is read or closed). Waiting
    # client requests go before background ones (warm, prefetch, read-ahead).
    max_concurrency: int = Field(default=64, ge=1, le=100_000)
    requests_per_second: float = Field(default=0.0, ge=0)
    bytes_per_second: Size = 0  # body bytes, throttled by delaying chunks


class RetryConfig(_Strict):
    """Full-jitter exponential backoff, bounded by a retry budget (Finagle's RetryBudget)."""

    base_delay: Duration = 0.05  # the first retry waits up to this, doubling each try
    max_delay: Duration = 5.0
    # Retries over the last 10 s may add this share of the requests, plus a floor.
    budget_ratio: float = Field(default=0.2, ge=0, le=10)
    budget_min_per_second: float = Field(default=10.0, ge=0)
    # A GET that delivers no byte this long gets a second request for what is missing
    # (first to deliver wins); none waits longer than the deadline for its next byte.
    hedge_after: Duration = 5.0
    deadline: Duration = 30.0


class BreakerConfig(_Strict):
    """Open after ``failures`` failed requests in a row; probe again after ``open_for``."""

    failures: int = Field(default=5, ge=0)  # 0: never open
    open_for: Duration = 5.0


class _OriginBase(_Strict):
    # Tries in all per request (1: no retries) on 5xx, SlowDown, timeouts, connection errors.
    max_attempts: int = Field(default=3, ge=1, le=20)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)


class S3OriginConfig(_OriginBase):
    type: Literal["s3"]
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: SecretStr | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    max_attempts: int = Field(default=5, ge=1, le=20)
    max_connections: int = Field(default=64, ge=1)
    connect_timeout: Duration = 10.0
    read_timeout: Duration = 60.0


class PosixOriginConfig(_OriginBase):
    type: Literal["posix"]
    path: Path


OriginConfig = Annotated[S3OriginConfig | PosixOriginConfig, Field(discriminator="type")]


class MountConfig(_Strict):
    bucket: str = Field(min_length=3, max_length=63)
    origin: str
    origin_bucket: str | None = None
    prefix: str = ""
    metadata_ttl: Duration = 60.0
    negative_ttl: Duration = 10.0
    readonly: bool = False
    # Objects written through this bucket (up to cache.write_through_max) are cached too.
    write_through: bool = True


class TlsConfig(_Strict):
    """HTTPS on the listen address: both PEM files, or neither (plain HTTP)."""

    cert: Path | None = None
    key: Path | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> TlsConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls needs both cert and key (PEM files)")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert is not None


class ClusterConfig(_Strict):
    self: str = ""
    peers: list[str] = Field(default_factory=list)
    dns: str = ""
    replicas: int = Field(default=1, ge=1)
    secret: SecretStr | None = None
    _secret_set = field_validator("secret")(_a_secret)
    # Failure detection: a peer leaves after fail_after failed probes or requests
    # (probe_interval apart), and returns after rejoin_after successes.
    probe_interval: Duration = 1.0
    probe_timeout: Duration = 1.0
    fail_after: int = Field(default=2, ge=1)
    rejoin_after: int = Field(default=3, ge=1)
    # A peer's silence before a block read falls back to the next node or the origin:
    # longer than an owner may wait for its own origin's first byte under load.
    peer_read_timeout: Duration = 30.0
    # The longest a write waits for other nodes to drop the key before answering.
    invalidation_timeout: Duration = 2.0
    # The longest a metadata miss waits for its owner node before asking the origin
    # itself: an owner may walk a long listing (1000 keys per origin page) first.
    metadata_timeout: Duration = 10.0
    # An owner missing a block asks this many nodes ranked after it (previous owners
    # after a join) for a cached copy before the origin; 0 turns that off.
    handoff_peers: int = Field(default=3, ge=0)
    # Invalidations remembered per unreachable peer, replayed when it is back; past
    # this it is told to drop its whole metadata cache instead.
    replay_limit: int = Field(default=10_000, ge=1)
    # CA certificates (PEM) that https:// peers are verified with; unset: the system's.
    ca_bundle: Path | None = None

    @property
    def enabled(self) -> bool:
        """A cluster needs this node's URL and somewhere to find the others."""
        return bool(self.self and (self.peers or self.dns))


class PrefetchConfig(_Strict):
    """Epoch-order prefetch (``POST /_hoard/prefetch``): bounds per node."""

    # Registered streams at once, and keys in one stream's order.
    max_streams: int = Field(default=64, ge=1, le=100_000)
    max_keys: int = Field(default=1_000_000, ge=1, le=100_000_000)
    # Bytes fetched ahead of a stream's position when its registration names no window,
    # and the most a registration may ask for.
    window: Size = parse_size("1GiB")
    max_window: Size = parse_size("8GiB")
    # A stream with no GET and no registration for this long is forgotten.
    idle: Duration = 600.0
    # Origin requests one stream keeps in flight: lookups of the next keys (a cold one is
    # the GET of block 0) and block fetches. One lookup costs a round trip, so a stream
    # covers about concurrency / RTT keys per second: 16 at 50 ms is 320 small objects/s,
    # more than a reader consumes; two streams still leave most of the origin's
    # limits.max_concurrency (64) to client misses, which go first anyway.
    concurrency: int = Field(default=16, ge=1, le=256)

    @model_validator(mode="after")
    def _window_bounds(self) -> PrefetchConfig:
        if self.window > self.max_window:
            raise ValueError("window must not exceed max_window")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="HOARD_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    listen: str = "127.0.0.1:9000"
    tls: TlsConfig = Field(default_factory=TlsConfig)
    # Worker processes on one port sharing the node's state; "auto": one per core this
    # process may use (CPU affinity and cgroup quota; cli.py resolves it at start).
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = 1
    cache: CacheConfig = Field(default_factory=CacheConfig)
    credentials: list[Credential] = Field(default_factory=list)
    allow_anonymous: bool = False
    origins: dict[str, OriginConfig] = Field(default_factory=dict)
    default_origin: str | None = None
    # Metadata TTLs of the buckets default_origin passes through (0: ask it every time).
    default_metadata_ttl: Duration = 60.0
    default_negative_ttl: Duration = 10.0
    mounts: list[MountConfig] = Field(default_factory=list)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    prefetch: PrefetchConfig = Field(default_factory=PrefetchConfig)
    warm: WarmConfig = Field(default_factory=WarmConfig)
    # The region Hoard answers as, as one S3 endpoint does: a SigV4 signature (header or
    # presigned URL) must be scoped to it (or to "auto", the region-less name that stores
    # such as Tigris and R2 document, and their clients sign with), else 400
    # AuthorizationHeaderMalformed naming it. "any": every region is accepted.
    region: str = Field(default="us-east-1", pattern=r"^[a-z0-9-]{1,64}$")
    # Host names under which "bucket.<domain>" means virtual-hosted-style addressing.
    virtual_host_domains: list[str] = Field(default_factory=lambda: ["localhost"])
    shutdown_timeout: Duration = 30.0
    # A client connection with no request under way is closed after this long, one that
    # sends a request's head too slowly too (aiohttp's own default, when not run by
    # web.run_app, is an hour: idle pools and slow senders held descriptors that long).
    keepalive_timeout: Duration = Field(default=75.0, gt=0)
    # An upload whose body sends nothing for this long is answered 400 RequestTimeout.
    body_timeout: Duration = Field(default=60.0, gt=0)
    # A client that takes no byte of an answer for this long has its connection dropped.
    send_timeout: Duration = Field(default=60.0, gt=0)
    # uvloop is faster for HTTP; the stdlib loop has native sendfile (uvloop's is emulated).
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One line per request on stderr (text or JSON); off with access_log: false.
    access_log: bool = True
    log_format: Literal["text", "json"] = "text"

    @field_validator("listen")
    @classmethod
    def _listen_has_port(cls, value: str) -> str:
        split_listen(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment must win over it.
        return (env_settings, init_settings)


def split_listen(listen: str) -> tuple[str, int]:
    """``"0.0.0.0:9000"`` / ``"[::1]:9000"`` → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid listen address {listen!r} (expected host:port)")
    return host.strip("[]") or "0.0.0.0", int(port)

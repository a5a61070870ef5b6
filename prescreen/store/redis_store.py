"""The fleet store: Redis, same keys and JSON values as the disk store.

Layout: ``prescreen:v1:{<key>}`` holds the entry's JSON text and
``prescreen:v1:{<key>}:hits`` its hit counter (the braces are a Redis Cluster
hash tag, so both live in one slot). ``put`` is ``SET NX``; an invalid value is
replaced under ``WATCH``. A hit reads the value and increments the counter in
one round trip (a Lua script; plain GET + INCR where scripting is refused).

Faults: sockets time out after ``timeout`` (0.5 s) and redis-py's own retries
are off; an unreachable server is warned about once and not contacted again
for ``cooldown`` seconds, so a compile never waits on a dead Redis.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from prescreen.errors import ConfigError
from prescreen.store.base import Store, StoreStats
from prescreen.store.entry import Entry

REDIS_URL_ENV = "PRESCREEN_REDIS_URL"
DEFAULT_PREFIX = "prescreen:v1:"
DEFAULT_TIMEOUT = 0.5
DEFAULT_COOLDOWN = 30.0
_BATCH = 200

_GET_AND_COUNT = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
if ARGV[1] == '1' then return {value, redis.call('INCR', KEYS[2])} end
return {value, tonumber(redis.call('GET', KEYS[2]) or '0')}
"""

T = TypeVar("T")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and stats)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class RedisStore(Store):
    """Decisions in Redis, shared by every machine that points at it."""

    backend = "redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
        cooldown: float = DEFAULT_COOLDOWN,
        count_hits: bool = True,
    ) -> None:
        super().__init__()
        url = url or os.environ.get(REDIS_URL_ENV, "").strip()
        if not url:
            raise ConfigError(f"no Redis URL given and {REDIS_URL_ENV} is not set")
        self.location = redact_url(url)
        self.prefix = prefix
        self.cooldown = cooldown
        self.count_hits = count_hits
        try:
            self._client = redis.Redis.from_url(
                url,
                socket_connect_timeout=timeout,
                socket_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
                decode_responses=False,
            )
        except ValueError as exc:
            raise ConfigError(f"{REDIS_URL_ENV}={self.location!r} is not a Redis URL: {exc}") from None
        self._script = self._client.register_script(_GET_AND_COUNT)
        self._use_script = True
        self._down_until = 0.0
        self._healthy = True

    # -- plumbing -----------------------------------------------------------

    def entry_key(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}"

    def hits_key(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}:hits"

    def _key_of(self, redis_key: bytes | str) -> str | None:
        text = redis_key.decode("utf-8", "replace") if isinstance(redis_key, bytes) else redis_key
        head = self.prefix + "{"
        if not (text.startswith(head) and text.endswith("}")):
            return None
        return text[len(head) : -1]

    def _call(self, op: Callable[[], T], default: T) -> T:
        if time.monotonic() < self._down_until:
            return default
        try:
            result = op()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._healthy = False
            self._down_until = time.monotonic() + self.cooldown
            self.warn_once("Redis is unreachable", f"{exc}; not contacting it for {self.cooldown:g} s")
            return default
        except redis.RedisError as exc:
            self._healthy = False
            self.warn_once("Redis error", exc)
            return default
        self._healthy = True
        return result

    def _decode(self, key: str, raw: object, *, warn: bool = True) -> Entry | None:
        return self.decode(key, raw, warn=warn)

    def _fetch(self, key: str) -> tuple[object, int]:
        names = [self.entry_key(key), self.hits_key(key)]
        if self._use_script:
            try:
                reply = self._script(keys=names, args=["1" if self.count_hits else "0"])
            except redis.ResponseError:  # scripting disabled (a proxy, an ACL): plain commands
                self._use_script = False
            else:
                return (None, 0) if reply is None else (reply[0], int(reply[1]))
        value = self._client.get(names[0])
        if value is None:
            return None, 0
        hits = self._client.incr(names[1]) if self.count_hits else int(self._client.get(names[1]) or 0)
        return value, int(hits)

    # -- the Store interface ----------------------------------------------------

    def get(self, key: str) -> Entry | None:
        raw, hits = self._call(lambda: self._fetch(key), (None, 0))
        entry = self._decode(key, raw)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry.with_hits(hits)

    def put(self, entry: Entry) -> bool:
        name, text = self.entry_key(entry.key), entry.with_hits(0).to_json()

        def store() -> bool:
            if self._client.set(name, text, nx=True):
                return True
            with self._client.pipeline() as pipe:
                try:
                    pipe.watch(name)
                    if self._decode(entry.key, pipe.get(name), warn=False) is not None:
                        return False
                    pipe.multi()
                    pipe.set(name, text)
                    pipe.delete(self.hits_key(entry.key))
                    pipe.execute()
                    return True
                except redis.WatchError:  # someone else wrote it meanwhile: theirs stands
                    return False

        return self._call(store, False)

    def keys(self) -> list[str]:
        """Every entry key under this prefix (valid or not)."""

        def scan() -> list[str]:
            found = (self._key_of(k) for k in self._client.scan_iter(match=self.prefix + "{*}", count=1000))
            return [k for k in found if k]

        return self._call(scan, [])

    def entries(self) -> Iterator[Entry]:
        keys = self.keys()
        for start in range(0, len(keys), _BATCH):
            batch = keys[start : start + _BATCH]
            names = [self.entry_key(k) for k in batch] + [self.hits_key(k) for k in batch]
            values = self._call(lambda names=names: self._client.mget(names), None)
            if values is None:
                return
            for i, key in enumerate(batch):
                entry = self._decode(key, values[i])
                if entry is not None:
                    yield entry.with_hits(int(values[len(batch) + i] or 0))

    def delete(self, keys: list[str]) -> int:
        def remove() -> int:
            removed = 0
            for start in range(0, len(keys), _BATCH):
                batch = keys[start : start + _BATCH]
                removed += int(self._client.delete(*[self.entry_key(k) for k in batch]))
                self._client.delete(*[self.hits_key(k) for k in batch])
            return removed

        return self._call(remove, 0) if keys else 0

    def clear_all(self) -> int:
        keys = self.keys()

        def clear() -> int:
            names = list(self._client.scan_iter(match=self.prefix + "*", count=1000))
            for start in range(0, len(names), _BATCH):
                self._client.delete(*names[start : start + _BATCH])
            return len(keys)

        return self._call(clear, 0)

    def stats(self) -> StoreStats:
        self._down_until = 0.0  # an explicit stats call always tries
        info = self._call(lambda: self._client.info("server"), None)
        count = len(self.keys()) if info is not None else 0
        detail = f"redis {info.get('redis_version', '?')}" if info else "unreachable"
        return StoreStats(self.backend, self.location, count, None, self.hits, self.misses, info is not None, detail)

    def close(self) -> None:
        try:
            self._client.close()
        except redis.RedisError:
            pass

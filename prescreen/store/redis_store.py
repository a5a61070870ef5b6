"""The fleet store: Redis, same keys and JSON values as the disk store.

``prescreen:v1:{<key>}`` holds the entry's text and ``...:hits`` its counter (one Redis Cluster slot). ``put`` is
``SET NX``; an invalid or less strict value is replaced under ``WATCH``. A hit reads and counts in one round trip
(a Lua script; plain commands where scripting is refused), reading only a value ``STRLEN`` says is within the cap.
A lookup or put has ``timeout`` in all (a dripping link costs the timeout once); a scan or batch, per command. An
unreachable server is warned about once and left alone for ``cooldown`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from prescreen.decision import is_observed_oom
from prescreen.errors import ConfigError
from prescreen.store.base import Refused, Store, StoreStats
from prescreen.store.entry import MAX_ENTRY_BYTES, Entry, outranks

REDIS_URL_ENV = "PRESCREEN_REDIS_URL"
_BATCH = 200

# Never fails on data: a value that is not a string or is over the size cap comes back as {0, why} unread; a
# counter INCR refuses (not an integer, another type) is reset to 1 and reported as -1.
_GET_AND_COUNT = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return false end
if kind ~= 'string' then return {0, 'a Redis ' .. kind .. ', not a string'} end
local size = redis.call('STRLEN', KEYS[1])
if size > tonumber(ARGV[1]) then return {0, 'a value of ' .. size .. ' bytes, over the cap'} end
local value = redis.call('GET', KEYS[1])
local ok, n = pcall(redis.call, 'INCR', KEYS[2])
if ok and n > 0 and n < 4611686018427387904 then return {value, n} end
redis.call('SET', KEYS[2], '1')
return {value, -1}
"""

T = TypeVar("T")
_SECRET_PARAMS = re.compile(r"(?i)([?&;](?:password|passwd|pass|pwd|secret|token|auth)[^=&;#]*=)([^&;#]*)")


def _userinfo(url: str) -> tuple[int, int] | None:
    """Where the ``user:password`` part of ``url`` is: between ``://`` (or the start, where a scheme was left
    out: ``user:PASSWORD@host:6379/0``) and the last ``@`` before any query."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    head = url.split("?", 1)[0]
    at = head.rfind("@")
    return (start, at) if at >= start else None


def redact_url(url: str) -> str:
    """``url`` with any password (``user:PASSWORD@``, even holding ``/`` or ``@``, or ``?password=``) as ``***``."""
    span = _userinfo(url)
    if span is not None:
        start, at = span
        user, colon, _ = url[start:at].partition(":")
        url = url[:start] + (f"{user}:***" if colon else "***") + url[at:]
    return _SECRET_PARAMS.sub(lambda m: m.group(1) + "***", url)


def scrub(text: str, url: str) -> str:
    """``text`` with every form ``url``'s password could take in a message (whole, in pieces, unquoted) as ``***``."""
    found: list[str] = []
    span = _userinfo(url)
    if span is not None:
        info = url[span[0] : span[1]]
        found += [info, info.partition(":")[2] or info]
    found.extend(m.group(2) for m in _SECRET_PARAMS.finditer(url))
    pieces = [piece for secret in found for piece in re.split(r"[/@:?#&;]", secret)]
    decoded = [urllib.parse.unquote(secret) for secret in found]
    for secret in sorted({s for s in found + pieces + decoded if len(s) >= 2}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class _Deadline(threading.local):
    """When the request in flight on this thread must be done by (``time.monotonic``), if it has one."""

    at: float | None = None  # one store call: a lookup, a put (``RedisStore._call``)
    span: float | None = None  # per command: each command sent gets this many seconds from its send


class _DeadlineSocket:
    """A connected socket (plain, TLS or Unix) whose receives and sends wait at most until ``deadline.at``:
    redis-py's ``socket_timeout`` bounds each ``recv``, which a server answering 64 B every 0.25 s never trips."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock, self._deadline, self._timeout = sock, deadline, sock.gettimeout()

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        at, timeout = self._deadline.at, self._timeout
        if at is None or timeout == 0:  # no deadline, or a non-blocking poll
            self._sock.settimeout(timeout)
            return
        left = at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(left if timeout is None else min(left, timeout))

    def recv(self, *args: int) -> bytes:
        self._arm()
        return self._sock.recv(*args)

    def recv_into(self, *args: object) -> int:
        self._arm()
        return self._sock.recv_into(*args)  # type: ignore[arg-type]

    def send(self, *args: object) -> int:
        self._arm()
        return self._sock.send(*args)  # type: ignore[arg-type]

    def sendall(self, *args: object) -> None:
        self._arm()
        self._sock.sendall(*args)  # type: ignore[arg-type]


def _with_deadline(base: type[redis.connection.AbstractConnection],
                   deadline: _Deadline) -> type[redis.connection.AbstractConnection]:
    """``base`` (the pool's connection class: TCP, TLS or Unix) with its sockets held to ``deadline``, the
    connect's timeout to the time left, and a per-command deadline armed at each send."""

    class DeadlineConnection(base):  # type: ignore[valid-type,misc]
        def _connect(self) -> _DeadlineSocket:
            configured: float | None = self.socket_connect_timeout  # type: ignore[has-type]
            if deadline.at is not None:
                left = max(deadline.at - time.monotonic(), 0.001)
                self.socket_connect_timeout = left if configured is None else min(configured, left)
            try:
                return _DeadlineSocket(super()._connect(), deadline)
            finally:
                self.socket_connect_timeout = configured  # type: ignore[assignment]

        def send_packed_command(self, command: object, check_health: bool = True) -> None:
            if deadline.span is not None:
                deadline.at = time.monotonic() + deadline.span
            super().send_packed_command(command, check_health)

    DeadlineConnection.__name__ = DeadlineConnection.__qualname__ = f"Deadline{base.__name__}"
    return DeadlineConnection


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _count(raw: object) -> int | None:
    """A counter Redis returned (an int, or the digits of a GET), or None when it is not a sane integer."""
    if isinstance(raw, bytes) and raw.isdigit() and len(raw) < 19:
        raw = int(raw)
    return raw if type(raw) is int and 0 <= raw < 2**62 else None


class RedisStore(Store):
    """Decisions in Redis, shared by every machine that points at it."""

    backend = "redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "prescreen:v1:",
        timeout: float = 0.5,
        cooldown: float = 30.0,
    ) -> None:
        super().__init__()
        url = url or os.environ.get(REDIS_URL_ENV, "").strip()
        if not url:
            raise ConfigError(f"no Redis URL given and {REDIS_URL_ENV} is not set")
        self.location = redact_url(url)
        self._url_secrets = url  # kept only to scrub messages; never shown
        self.prefix = prefix
        self.cooldown = cooldown
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
            raise ConfigError(f"{REDIS_URL_ENV}={self.location!r} is not a Redis URL: {scrub(str(exc), url)}") from None
        self.timeout = timeout
        self._deadline = _Deadline()
        pool = self._client.connection_pool
        pool.connection_class = _with_deadline(pool.connection_class, self._deadline)
        self._script = self._client.register_script(_GET_AND_COUNT)
        self._use_script = True
        self._down_until = 0.0

    def warn_once(self, what: str, exc: BaseException | str) -> None:
        """As ``Store.warn_once``, with any form of the URL's password scrubbed from the message."""
        super().warn_once(what, scrub(str(exc), self._url_secrets))

    def entry_key(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}"

    def hits_key(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}:hits"

    def _call(self, op: Callable[[], T], default: T, force: bool = False, per_command: bool = False) -> T:
        """``op`` within ``timeout`` (``per_command``: each command it sends), or ``default`` on a fault or while the
        server is left alone (``force``: a fact's write is tried even then)."""
        if not force and time.monotonic() < self._down_until:
            return default
        deadline = self._deadline
        if per_command:
            deadline.span = self.timeout
        else:
            deadline.at = time.monotonic() + self.timeout
        try:
            return op()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._down_until = time.monotonic() + self.cooldown
            self.warn_once("Redis is unreachable", f"{exc}; not contacting it for {self.cooldown:g} s")
        except redis.RedisError as exc:
            self.warn_once("Redis error", exc)
        finally:
            deadline.at = deadline.span = None
        return default

    def _counter(self, key: str, raw: object) -> int:
        """A hit counter as read back; one that is not a sane integer counts as 0 (and was reset when counting)."""
        count = _count(raw)
        if count is None:
            self.warn_once("invalid hit counter", f"key {key[:12]}: {str(raw)[:40]!r} counts as 0")
            return 0
        return count

    def _fetch(self, key: str) -> tuple[object, int]:
        names = [self.entry_key(key), self.hits_key(key)]
        if self._use_script:
            try:
                reply = self._script(keys=names, args=[str(MAX_ENTRY_BYTES)])
            except redis.ResponseError:  # scripting disabled (a proxy, an ACL): plain commands
                self._use_script = False
            else:
                if reply is None:
                    return None, 0
                if isinstance(reply[0], int):  # refused unread
                    return Refused(f"value is {_text(reply[1])}"), 0
                return reply[0], self._counter(key, reply[1])
        value = self._read_value(self._client, names[0])
        if value is None or isinstance(value, Refused):
            return value, 0
        try:
            count = _count(self._client.incr(names[1]))
        except redis.ResponseError:  # not an integer, or another type: restart it
            count = None
        if not count:
            self._client.set(names[1], 1)
        return value, self._counter(key, count or -1)

    @staticmethod
    def _read_value(client: redis.Redis | redis.client.Pipeline, name: str) -> object:
        """The value under ``name``, read only once ``TYPE`` and ``STRLEN`` say it is a string within
        ``MAX_ENTRY_BYTES`` (else ``Refused``, unread); None when there is none."""
        kind = _text(client.type(name))
        if kind == "none":
            return None
        if kind != "string":
            return Refused(f"value is a Redis {kind}, not a string")
        size = int(client.strlen(name))
        if size > MAX_ENTRY_BYTES:
            return Refused(f"value is a value of {size} bytes, over the cap")
        return client.get(name)

    def get(self, key: str) -> Entry | None:
        nothing: tuple[object, int] = (None, 0)
        raw, hits = self._call(lambda: self._fetch(key), nothing)
        entry = self.decode(key, raw)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry.with_hits(hits)

    def put(self, entry: Entry) -> bool:
        name, text = self.entry_key(entry.key), entry.with_hits(0).to_json(self.signer)

        def store() -> bool:
            if self._client.set(name, text, nx=True):
                return True
            with self._client.pipeline() as pipe:
                try:
                    pipe.watch(name)  # type: ignore[no-untyped-call]
                    there = self.decode(entry.key, self._read_value(pipe, name), warn=False)
                    if there is not None and not outranks(entry.decision, there.decision):
                        return False
                    pipe.multi()
                    pipe.set(name, text)
                    pipe.delete(self.hits_key(entry.key))
                    pipe.execute()
                    return True
                except redis.WatchError:  # someone else wrote it meanwhile: theirs stands
                    return False

        return self._call(store, False, force=is_observed_oom(entry.decision))

    def keys(self) -> list[str]:
        """Every entry key under this prefix (valid or not)."""

        head = self.prefix + "{"

        def scan() -> list[str]:
            names = (_text(n) for n in self._client.scan_iter(match=head + "*}", count=1000))
            return [n[len(head) : -1] for n in names if n.startswith(head) and len(n) > len(head) + 1]  # ends in }

        return self._call(scan, [], per_command=True)

    def _read_batch(self, batch: list[str]) -> list[tuple[object, object]]:
        """(value, counter) for each key; a value over the size cap or not a string comes back refused, unread."""
        with self._client.pipeline(transaction=False) as pipe:
            for k in batch:
                pipe.strlen(self.entry_key(k))
            sizes = pipe.execute(raise_on_error=False)
        small = [k for k, n in zip(batch, sizes) if isinstance(n, int) and 0 < n <= MAX_ENTRY_BYTES]
        got = self._client.mget([self.entry_key(k) for k in small] + [self.hits_key(k) for k in batch])
        values: dict[str, object] = dict(zip(small, got))
        for k, n in zip(batch, sizes):
            if not isinstance(n, int):
                values[k] = Refused("value is not a Redis string")
            elif n > MAX_ENTRY_BYTES:
                values[k] = Refused(f"value is a value of {n} bytes, over the cap")
        return [(values.get(k), counter) for k, counter in zip(batch, got[len(small) :])]

    def entries(self) -> Iterator[Entry]:
        keys = self.keys()
        for start in range(0, len(keys), _BATCH):
            batch = keys[start : start + _BATCH]
            rows = self._call(lambda batch=batch: self._read_batch(batch), None, per_command=True)  # type: ignore[misc]
            if rows is None:
                return
            for key, (value, counter) in zip(batch, rows):
                entry = self.decode(key, value)
                if entry is not None:
                    yield entry.with_hits(self._counter(key, counter or 0))

    def _delete(self, names: list[str] | list[bytes]) -> int:
        """DEL ``names`` in batches; returns how many existed."""
        return sum(int(self._client.delete(*names[i : i + _BATCH])) for i in range(0, len(names), _BATCH))

    def delete(self, keys: list[str]) -> int:
        def remove() -> int:
            removed = self._delete([self.entry_key(k) for k in keys])
            self._delete([self.hits_key(k) for k in keys])
            return removed

        return self._call(remove, 0, per_command=True)

    def clear_all(self) -> int:
        keys = self.keys()

        def clear() -> int:
            self._delete(list(self._client.scan_iter(match=self.prefix + "*", count=1000)))
            return len(keys)

        return self._call(clear, 0, per_command=True)

    def stats(self) -> StoreStats:
        self._down_until = 0.0  # an explicit stats call always tries
        info = self._call(lambda: self._client.info("server"), None)
        count = len(self.keys()) if info is not None else 0
        detail = f"redis {info.get('redis_version', '?')}" if info else "unreachable"
        return StoreStats(self.backend, self.location, count, None, self.hits, self.misses, info is not None, detail)

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._client.close()

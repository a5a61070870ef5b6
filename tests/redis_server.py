"""A throwaway redis-server on loopback for the Redis tests (they skip, saying why, without one)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server(workdir: Path, password: str | None = None) -> Iterator[int]:
    """Start ``redis-server`` on a free loopback port (no persistence), yield the port, stop it."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server); Redis tests skipped")
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]
    if password is not None:
        argv += ["--requirepass", password]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.skip(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)

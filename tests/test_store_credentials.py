"""A Redis password never appears in stats, inspect, warm --json, error lines or warnings, whatever its form."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from redis_server import redis_server
from test_store_support import plan_payload

from prescreen.cli import cli
from prescreen.errors import ConfigError
from prescreen.store import RedisStore
from prescreen.store.redis_store import redact_url

PASSWORD = "hunter2/x@y"
PIECES = ("hunter2", "x@y", "x/y")  # what must never be printed, whole or in part

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with redis_server(tmp_path_factory.mktemp("redis-auth"), password=PASSWORD) as port:
        yield port


def working_urls(port: int) -> dict[str, str]:
    escaped = "hunter2%2Fx%40y"
    return {
        "userinfo": f"redis://:{escaped}@127.0.0.1:{port}/0",
        "user-and-password": f"redis://default:{escaped}@127.0.0.1:{port}/0",
        "query": f"redis://127.0.0.1:{port}/0?password={escaped}",
    }


def broken_urls(port: int) -> dict[str, str]:
    return {
        "unescaped-slash": f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
        "unescaped-with-user": f"redis://default:{PASSWORD}@127.0.0.1:{port}/0",
        "wrong-password": f"redis://:hunter2x%40y@127.0.0.1:{port}/0",
        "query-unreachable": f"redis://127.0.0.1:1/0?password={PASSWORD}",
    }


def leaks(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def run(tmp_path: Path, url: str, *args: str) -> Result:
    env = {"PRESCREEN_REDIS_URL": url, "PRESCREEN_REDIS_LOCAL_TIER": "0", "PRESCREEN_CACHE_DIR": str(tmp_path)}
    return CliRunner().invoke(cli, list(args), env=env)


@pytest.mark.parametrize("form", ["userinfo", "user-and-password", "query"])
def test_commands_never_print_the_password(port: int, tmp_path: Path, form: str, caplog) -> None:
    url = working_urls(port)[form]
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps([plan_payload(1)]))
    with caplog.at_level(logging.DEBUG):
        warm = run(tmp_path, url, "warm", "--plans", str(plans), "--device-memory", "16GiB", "--json")
        assert warm.exit_code == 0, warm.output
        assert "***" in json.loads(warm.stdout)["store"]
        outputs = [warm.output]
        for command in (["stats"], ["inspect"], ["export", str(tmp_path / "b.json")]):
            result = run(tmp_path, url, *command)
            assert result.exit_code == 0, (command, result.output)
            outputs.append(result.output)
    assert "***" in outputs[1] and "***" in outputs[2]  # stats' location and inspect's title name the store
    for text in [*outputs, caplog.text]:
        assert not leaks(text), text


@pytest.mark.parametrize("form", ["unescaped-slash", "unescaped-with-user", "wrong-password", "query-unreachable"])
def test_error_lines_never_print_the_password(port: int, tmp_path: Path, form: str, caplog) -> None:
    url = broken_urls(port)[form]
    with caplog.at_level(logging.DEBUG):
        result = run(tmp_path, url, "stats")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert not leaks(result.output + caplog.text), result.output + caplog.text


def test_library_errors_and_warnings_are_scrubbed(port: int, caplog) -> None:
    with pytest.raises(ConfigError) as raised:
        RedisStore(broken_urls(port)["unescaped-slash"])
    assert not leaks(str(raised.value)), raised.value
    misrouted = f"redis://default:hunter2@x/y@127.0.0.1:{port}/0"  # parses as host "x": a connection error
    with caplog.at_level(logging.WARNING), RedisStore(misrouted, timeout=0.2) as store:
        assert store.get("0" * 64) is None
        assert caplog.records
        assert not leaks(store.location + str(store.stats()) + caplog.text)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://alice:p/w@d@h:1/0", "redis://alice:***@h:1/0"),
        ("redis://h:1/0?password=pw&db=2", "redis://h:1/0?password=***&db=2"),
        ("rediss://h/0?ssl_cert_reqs=none&Password=pw", "rediss://h/0?ssl_cert_reqs=none&Password=***"),
        ("unix://:pw@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
        ("redis://token@h", "redis://***@h"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown

"""Memory sizes, the ratio and its env vars, the inclusive budget."""

from __future__ import annotations

import pytest
import torch

from prescreen.budget import (
    DEFAULT_RATIO,
    MEMORY_ENV,
    NPU_RATIO_ENV,
    RATIO_ENV,
    Budget,
    device_memory,
    format_bytes,
    parse_memory,
    parse_ratio,
    resolve_ratio,
)
from prescreen.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (RATIO_ENV, NPU_RATIO_ENV, MEMORY_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64GiB", 64 * 2**30),
        ("80GB", 80 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("64Gi", 64 * 2**30),  # Kubernetes' spelling
        ("512Mi", 512 * 2**20),
        ("1e9", 10**9),  # bytes, exactly
        ("2.5e3KiB", 2500 * 1024),
        (".5k", 500),
        ("1e18", 10**18),
        ("2 kib", 2048),
        (" 7 TiB ", 7 * 2**40),
        ("1TB", 10**12),
        ("4k", 4000),
        ("3m", 3 * 10**6),
        ("16g", 16 * 10**9),
        ("100b", 100),
        ("100B", 100),
        ("1024", 1024),
        (1024, 1024),
    ],
)
def test_parse_memory(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "GiB", "-1GiB", "0", "0GiB", "0.4b", "1XB", "1.2.3GB", "12 Gibibytes", "1_000", "2e18",
                                  "1e999999999", "0.5", "1e-3", "inf", "nan", "1e9.5"])
def test_parse_memory_rejects_bad_strings(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_memory(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [0, -5, True, 2**61])
def test_parse_memory_rejects_bad_ints(value: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_memory(value)
    assert str(value) in str(info.value)


def test_format_bytes() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**29) == "1.5 GiB"


def test_default_ratio() -> None:
    assert DEFAULT_RATIO == 0.25
    assert resolve_ratio() == 0.25


def test_ratio_env_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NPU_RATIO_ENV, "0.5")
    assert resolve_ratio() == 0.5
    monkeypatch.setenv(RATIO_ENV, "0.75")
    assert resolve_ratio() == 0.75
    assert resolve_ratio(0.1) == 0.1
    assert resolve_ratio("1") == 1.0
    monkeypatch.setenv(RATIO_ENV, "  ")
    assert resolve_ratio() == 0.5  # blank means unset


@pytest.mark.parametrize("value", ["0", "1.5", "1.0000001", "nan", "inf", "-inf", "abc", "-0.25", ""])
@pytest.mark.parametrize("env", [RATIO_ENV, NPU_RATIO_ENV])
def test_invalid_env_ratio_names_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    if value == "":
        value = "0x"  # a blank var is unset; use another non-number
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        resolve_ratio()
    assert env in str(info.value)
    assert repr(value) in str(info.value)


def test_invalid_env_ratio_wins_over_valid_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RATIO_ENV, "2")
    monkeypatch.setenv(NPU_RATIO_ENV, "0.5")
    with pytest.raises(ConfigError, match=RATIO_ENV):
        resolve_ratio()


@pytest.mark.parametrize("value", [0, 0.0, 1.01, float("nan"), -1, "x", None, [0.5]])
def test_invalid_explicit_ratio(value: object) -> None:
    with pytest.raises(ConfigError, match="ratio"):
        parse_ratio(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1, 1.0, "1", 1e-9, "0.25"])
def test_valid_ratio_edges(value: object) -> None:
    assert 0 < parse_ratio(value) <= 1  # type: ignore[arg-type]


def test_budget_is_inclusive() -> None:
    budget = Budget("npu", 64 * 2**30, 0.25)
    assert budget.budget_bytes == 16 * 2**30
    assert budget.admits(budget.budget_bytes)
    assert not budget.admits(budget.budget_bytes + 1)
    assert budget.admits(0)


def test_budget_truncates_like_upstream() -> None:
    budget = Budget("npu", 10, 0.33)
    assert budget.budget_bytes == int(10 * 0.33) == 3
    assert budget.admits(3) and not budget.admits(4)


def test_device_memory_override_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_memory("npu:0", "64GiB").total_bytes == 64 * 2**30
    assert device_memory("npu:0", "64GiB").kind == "npu"
    assert device_memory(torch.device("cuda", 1), 1000).kind == "cuda"
    monkeypatch.setenv(MEMORY_ENV, "80GB")
    mem = device_memory("cuda:0")
    assert (mem.kind, mem.total_bytes, mem.source) == ("cuda", 80 * 10**9, "env")
    assert device_memory("cuda:0", "1GiB").source == "override"  # the argument beats the env var
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match=MEMORY_ENV):
        device_memory("cuda:0")


def test_device_memory_of_this_host() -> None:
    mem = device_memory()
    assert mem.kind == "cpu" and mem.total_bytes > 0 and mem.source == "device"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="not available"):
            device_memory("cuda:0")
    with pytest.raises(ConfigError, match="unknown device"):
        device_memory("tpu:0")


def test_budget_for_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NPU_RATIO_ENV, "0.5")
    budget = Budget.for_device("npu:0", "32GiB")
    assert budget == Budget("npu", 32 * 2**30, 0.5)
    assert budget.budget_bytes == 16 * 2**30
    assert Budget.for_device("npu:0", "32GiB", ratio=1).budget_bytes == 32 * 2**30

"""``PRESCREEN_BUDGET_BASIS=free``: the budget follows free device memory, rounded down to whole GiB."""

from __future__ import annotations

import types

import pytest
import torch

from prescreen.budget import BASIS_ENV, FREE_STEP, Budget, budget_basis, device_memory
from prescreen.errors import ConfigError
from prescreen.key import build_key
from prescreen.plan import KernelPlan

TOTAL = 141 * 2**30


@pytest.fixture()
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    state = {"free": 10 * 2**30 + 12345}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: types.SimpleNamespace(total_memory=TOTAL))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda _d: 1.0, raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _d=None: (state["free"], TOTAL))
    monkeypatch.delenv("PRESCREEN_DEVICE_MEMORY", raising=False)
    return state


def test_default_basis_is_total(fake_cuda: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BASIS_ENV, raising=False)
    assert budget_basis() == "total"
    assert device_memory(torch.device("cuda", 0)).total_bytes == TOTAL


def test_free_basis_rounds_down_to_whole_gib_and_shares_keys(fake_cuda: dict[str, int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BASIS_ENV, "free")
    mem = device_memory(torch.device("cuda", 0))
    assert mem.total_bytes == 10 * FREE_STEP and mem.source == "free"
    plan = KernelPlan(group_features=(), axis_names=(), axis_static_values=(), args=())
    key_a = build_key(plan, Budget.for_device(torch.device("cuda", 0), None, 0.25))[0]
    fake_cuda["free"] = 10 * 2**30 + 999_999  # a little more free, same GiB: same key
    key_b = build_key(plan, Budget.for_device(torch.device("cuda", 0), None, 0.25))[0]
    fake_cuda["free"] = 9 * 2**30  # a GiB less: another key
    key_c = build_key(plan, Budget.for_device(torch.device("cuda", 0), None, 0.25))[0]
    assert key_a == key_b != key_c


def test_free_basis_below_one_gib_is_exact(fake_cuda: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BASIS_ENV, "free")
    fake_cuda["free"] = 300 * 2**20
    assert device_memory(torch.device("cuda", 0)).total_bytes == 300 * 2**20


def test_bad_basis_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BASIS_ENV, "half")
    with pytest.raises(ConfigError, match="PRESCREEN_BUDGET_BASIS='half'"):
        budget_basis()


def test_a_devices_total_memory_is_read_once_and_the_live_numbers_every_time(
    fake_cuda: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device's total memory never changes: read once per device; the per-process cap and free memory are
    read at every budget."""
    reads: list[object] = []
    fraction = {"value": 1.0}

    def props(device: object) -> object:
        reads.append(device)
        return types.SimpleNamespace(total_memory=TOTAL if getattr(device, "index", None) == 0 else TOTAL // 2)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda _d: fraction["value"], raising=False)
    monkeypatch.delenv(BASIS_ENV, raising=False)
    zero, one = torch.device("cuda", 0), torch.device("cuda", 1)
    assert device_memory(zero).total_bytes == TOTAL
    assert device_memory(one).total_bytes == TOTAL // 2
    fraction["value"] = 0.5
    assert device_memory(zero).total_bytes == TOTAL // 2  # the cap, read live
    assert reads == [zero, one]
    monkeypatch.setenv(BASIS_ENV, "free")
    fake_cuda["free"] = 3 * 2**30
    assert device_memory(zero).total_bytes == 3 * 2**30
    assert device_memory("cuda").total_bytes == 3 * 2**30  # no index: read every time
    assert reads == [zero, one, "cuda"]

"""Clear predicates and the --older-than duration parser."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_store_support import make_entry, make_plan

from prescreen.budget import Budget
from prescreen.errors import ConfigError
from prescreen.service import lookup_or_decide
from prescreen.store import DiskStore
from prescreen.store.clear import (
    Predicate,
    build_predicate,
    match_device,
    match_kernel,
    match_key_prefix,
    parse_duration,
)
from prescreen.store.entry import Entry

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 604800),
        ("12h", 43200),
        ("30m", 1800),
        ("45s", 45),
        ("90", 90),
        ("1.5h", 5400),
        ("2w", 1209600),
        ("3D", 259200),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7x", "", "-1d", "d", "7 days", "1h30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text)
    assert repr(text) in str(info.value) and "7d" in str(info.value)


def entries() -> list[Entry]:
    npu = [dataclasses.replace(make_entry(s), created_at=NOW - s * 3600) for s in range(4)]
    cuda_budget = Budget("cuda", 80 * 10**9, 0.25)
    cuda = lookup_or_decide(make_plan(9), cuda_budget, None).entry
    assert cuda is not None
    return [*npu, dataclasses.replace(cuda, created_at=NOW)]


def selected(**kw: object) -> list[int]:
    pred = build_predicate(now=NOW, **kw)
    return [i for i, e in enumerate(entries()) if pred(e)]


def test_filters_and_their_conjunction() -> None:
    es = entries()
    assert selected(everything=True) == [0, 1, 2, 3, 4]
    assert selected(device="cuda") == [4] and selected(device="NPU") == [0, 1, 2, 3]
    assert selected(kernel=es[2].kernel) == [2]
    assert selected(kernel="fused_3") == [3]  # a plain name matches as a substring
    assert selected(kernel="triton_poi_fused_*") == [0, 1, 2, 3, 4]
    assert selected(kernel="fused_*") == []  # a glob matches the whole name
    assert selected(older_than="90m") == [2, 3]
    assert selected(older_than=3600 * 2.5) == [3]
    assert selected(older_than="1h", device="npu", kernel="*_3") == [3]
    assert selected(key_prefix=es[1].key[:10].upper()) == [1]


def test_bad_filters() -> None:
    with pytest.raises(ConfigError, match="nothing selected"):
        build_predicate()
    with pytest.raises(ConfigError, match="cannot be combined"):
        build_predicate(everything=True, device="npu")
    with pytest.raises(ConfigError, match="'xyz'"):
        match_key_prefix("xyz")
    with pytest.raises(ConfigError):
        match_kernel("")
    with pytest.raises(ConfigError):
        match_device(" ")
    with pytest.raises(ConfigError, match="'soon'"):
        build_predicate(older_than="soon")


def test_delete_selected_on_a_disk_store(tmp_path: Path) -> None:
    def remove_where(store: DiskStore, predicate: Predicate) -> list[Entry]:
        doomed = [e for e in store.entries() if predicate(e)]
        store.delete([e.key for e in doomed])
        return doomed

    with DiskStore(tmp_path / "c") as store:
        es = entries()
        for e in es:
            assert store.put(e)
        removed = remove_where(store, build_predicate(older_than="90m", now=NOW))
        assert sorted(e.key for e in removed) == sorted(e.key for e in es[2:4])
        assert sorted(store.keys()) == sorted(e.key for e in (es[0], es[1], es[4]))
        assert [e.key for e in remove_where(store, build_predicate(device="cuda"))] == [es[4].key]
        assert sorted(store.keys()) == sorted(e.key for e in es[:2])

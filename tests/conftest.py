"""Shared test setup: subprocesses never see the repository on ``sys.path``; a configured guard store.

``python -c`` and ``python -m`` put the working directory first on ``sys.path``;
``PYTHONSAFEPATH`` (Python 3.11+) stops that, so a subprocess started from the
repository imports the installed prescreen, as the parent does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYTHONSAFEPATH", "1")


@pytest.fixture()
def guard_store(tmp_path: Path) -> Iterator[Any]:
    """The hooks' state as on a 64 GiB device at ratio 0.25, with a fresh disk store (reset after)."""
    from prescreen.hooks import state
    from prescreen.store import DiskStore

    state.reset()
    store = DiskStore(tmp_path / "s")
    state.configure(store=store, device_memory="64GiB", ratio=0.25)
    yield store
    state.reset()

"""Which torch_npu release's grouped-footprint semantics prescreen mirrors.

prescreen's representatives and footprint follow torch_npu 2.14's
``build_group_representatives`` and ``estimate_grouped_benchmark_footprint``
(checked against the released wheel by the differential tests). Ascend's
unreleased master changes them (a floor instead of a ceil for a closed bucket
of a product with static axes, unreachable groups). So the semantics are a
function of the installed torch_npu: a release prescreen has not been checked
against gets no prescreen decision at all, and the hook defers to torch_npu's
own guard. The torch_npu version is part of every key, so entries made under
one release are never reused under another.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

#: torch_npu release series (major.minor) whose semantics prescreen implements, and their name.
MIRRORED_SERIES: dict[str, str] = {"2.14": "torch_npu-2.14"}

_SERIES_RE = re.compile(r"^\s*(\d+)\.(\d+)")


@functools.cache
def installed_npu_version() -> str | None:
    """The installed torch_npu distribution's version, or None when it is not installed."""
    for dist in ("torch_npu", "torch-npu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def npu_semantics(version: str | None) -> str | None:
    """The semantics prescreen uses for torch_npu ``version``; None where prescreen has none.

    ``None`` (no torch_npu distribution, e.g. torch_npu's sources loaded from
    its wheel by the tests) means the mirrored 2.14 sources.
    """
    if version is None:
        return MIRRORED_SERIES["2.14"]
    match = _SERIES_RE.match(version)
    if match is None:
        return None
    return MIRRORED_SERIES.get(f"{match.group(1)}.{match.group(2)}")

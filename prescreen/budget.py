"""Device-memory budget: total memory of the target device times a ratio."""

from __future__ import annotations

import dataclasses
import decimal
import math
import os
import re
from typing import Any

from prescreen.errors import ConfigError

DEFAULT_RATIO = 0.25
RATIO_ENV = "PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO"
NPU_RATIO_ENV = "INDUCTOR_ASCEND_SYMBOLIC_GROUP_MAX_BENCHMARK_MEMORY_RATIO"
MEMORY_ENV = "PRESCREEN_DEVICE_MEMORY"
BASIS_ENV = "PRESCREEN_BUDGET_BASIS"
BASES = ("total", "free")
#: ``PRESCREEN_BUDGET_BASIS=free`` rounds free memory down to this step, so processes that see
#: nearly the same free memory share keys (the key holds the memory a decision was made for).
FREE_STEP = 2**30


def _env(name: str) -> str | None:
    """``$name`` stripped, or None where it is unset or blank (blank means "not set")."""
    return os.environ.get(name, "").strip() or None


def budget_basis() -> str:
    """``total`` (default, as upstream) or ``free`` (the device's free memory at compile time)."""
    raw = (_env(BASIS_ENV) or "total").lower()
    if raw not in BASES:
        raise ConfigError(f"{BASIS_ENV}={raw!r} is not one of {', '.join(BASES)}")
    return raw


_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,  # Kubernetes' spelling of the binary units
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: A number (``64``, ``1.5``, ``.5``, ``1e9``) and a unit; a number with an exponent is an exact decimal.
_MEMORY_RE = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
#: The largest memory size accepted (1 EiB): more than any device, so a larger one is a typo.
MAX_MEMORY = 2**60
_SIZES = "expected e.g. 64GiB, 64Gi, 80GB, 512MiB, or bytes: 68719476736 or 1e9"


def parse_memory(text: str | int) -> int:
    """Bytes from ``"64GiB"`` (or ``"64Gi"``), ``"80GB"``, ``"512MiB"``, ``"1e9"`` or a plain integer.

    A string's error starts with the string, so a caller prefixes where it came from (``--device-memory``).
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"device memory must be positive, got {text}")
        if text > MAX_MEMORY:
            raise ConfigError(f"device memory {text} is more than 1 EiB ({MAX_MEMORY} bytes), larger than any device")
        return text
    match = _MEMORY_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit is None or unit not in _UNITS:
        raise ConfigError(f"{str(text)!r} is not a memory size ({_SIZES})")
    number = decimal.Decimal(match.group(1))
    if number and number.adjusted() > 30:  # checked before any arithmetic: 1e999999999 stays cheap
        value = decimal.Decimal(MAX_MEMORY + 1)
    else:
        value = number * _UNITS[unit]
    if value > MAX_MEMORY:
        raise ConfigError(f"{str(text)!r} is more than 1 EiB ({MAX_MEMORY} bytes), larger than any device")
    if value == 0:
        raise ConfigError(f"{str(text)!r} is not positive (device memory must be positive)")
    if value < 1:
        raise ConfigError(f"{str(text)!r} is less than one byte ({_SIZES})")
    return int(value)


def format_bytes(n: int | None) -> str:
    """Human-readable binary size: ``1.5 GiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def parse_ratio(text: str | float, source: str = "ratio") -> float:
    """A ratio in (0, 1]; anything else is a ``ConfigError`` naming ``source``."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}={text!r} is not a number (expected a ratio in (0, 1])") from None
    if not math.isfinite(value) or value <= 0.0 or value > 1.0:
        raise ConfigError(f"{source}={text!r} is out of range (expected a ratio in (0, 1])")
    return value


def resolve_ratio(explicit: float | str | None = None) -> float:
    """Explicit value, else ``$PRESCREEN_...``, else torch_npu's env var, else 0.25."""
    own = ratio_override(explicit)
    if own is not None:
        return own
    raw = _env(NPU_RATIO_ENV)
    return DEFAULT_RATIO if raw is None else parse_ratio(raw, NPU_RATIO_ENV)


def ratio_override(explicit: float | str | None = None) -> float | None:
    """prescreen's own ratio (explicit, else ``$PRESCREEN_MAX_BENCHMARK_MEMORY_RATIO``), or None; torch_npu's
    variable is ignored (where torch_npu is loaded its config object is the authority)."""
    if explicit is not None:
        return parse_ratio(explicit, "--ratio")
    raw = _env(RATIO_ENV)
    return None if raw is None else parse_ratio(raw, RATIO_ENV)


def memory_override(explicit: str | int | None = None) -> int | None:
    """prescreen's own device memory (explicit, else ``$PRESCREEN_DEVICE_MEMORY``), or None."""
    if explicit is not None:
        return parse_memory(explicit)
    raw = _env(MEMORY_ENV)
    try:
        return None if raw is None else parse_memory(raw)
    except ConfigError as exc:
        raise ConfigError(f"{MEMORY_ENV} {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceMemory:
    """The device a decision is for: kind (cuda, npu, cpu) and total bytes."""

    kind: str
    total_bytes: int
    source: str  # "device", "override" or "env"


#: (the backend's ``get_device_properties``, device index) -> that device's total memory, which never changes
_totals: dict[tuple[object, int], int] = {}


def _device_total(backend: Any, device: object) -> int:
    """``backend.get_device_properties(device).total_memory``, read once per device with an index (a hook asks
    at every guarded step); raises ``ConfigError`` where the device is not there or reports no memory."""
    index = getattr(device, "index", None)
    props_of = getattr(backend, "get_device_properties", None)
    known = (props_of, index) if isinstance(index, int) and props_of is not None else None
    if known is not None and known in _totals:
        return _totals[known]
    if not backend.is_available():
        raise ConfigError(f"device {device!s} is not available here; pass --device-memory or set {MEMORY_ENV}")
    total = int(backend.get_device_properties(device).total_memory)
    if total <= 0:
        raise ConfigError(f"device {device!s} reports invalid total memory {total}")
    if known is not None:
        _totals[known] = total
    return total


def device_memory(device: object = None, override: str | int | None = None) -> DeviceMemory:
    """Total memory of ``device`` (torch.cuda / torch.npu), or the override (argument, else
    ``$PRESCREEN_DEVICE_MEMORY``) a CPU-only build box plans other hardware with; a CPU's is the host's."""
    kind = str(getattr(device, "type", None) or ("cpu" if device is None else str(device).split(":")[0]))
    if override is not None:
        return DeviceMemory(kind, parse_memory(override), "override")
    from_env = memory_override()
    if from_env is not None:
        return DeviceMemory(kind, from_env, "env")
    import torch

    if kind in ("cuda", "npu", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is None:
            raise ConfigError(f"device {device!s} is not available here; pass --device-memory or set {MEMORY_ENV}")
        total = _device_total(backend, device)
        if budget_basis() == "free":
            free = int(backend.mem_get_info(device)[0])
            rounded = free - free % FREE_STEP if free >= FREE_STEP else free  # never more than is free
            if rounded <= 0:
                raise ConfigError(f"device {device!s} has no free memory ({BASIS_ENV}=free)")
            return DeviceMemory(kind, rounded, "free")
        fraction_of = getattr(backend, "get_per_process_memory_fraction", None)
        if fraction_of is not None:  # a torch.cuda.set_per_process_memory_fraction cap
            try:
                fraction = float(fraction_of(device))
            except (RuntimeError, TypeError, ValueError):
                fraction = 1.0
            if 0 < fraction < 1:
                return DeviceMemory(kind, int(total * fraction), "device (per-process fraction)")
        return DeviceMemory(kind, total, "device")
    if kind == "cpu":
        return DeviceMemory(kind, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "device")
    raise ConfigError(f"unknown device {device!s}; pass --device-memory or set {MEMORY_ENV}")


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """The bytes a benchmark may synthesize: ``int(total * ratio)``, inclusive, as torch_npu's guard computes it.

    ``ratio`` keeps its type: an int ratio multiplies exactly, so 1 and 1.0 differ above 2**53 bytes (and key).
    """

    device_kind: str
    total_memory: int
    ratio: float  # or an int

    @property
    def budget_bytes(self) -> int:
        return int(self.total_memory * self.ratio)

    def admits(self, nbytes: int) -> bool:
        return nbytes <= self.budget_bytes

    @staticmethod
    def for_device(device: object = None, memory: str | int | None = None, ratio: float | str | None = None) -> "Budget":
        mem = device_memory(device, memory)
        return Budget(mem.kind, mem.total_bytes, resolve_ratio(ratio))

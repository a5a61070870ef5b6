"""What ``prescreen warm`` compiles: a target callable, shape families, a spec file."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prescreen.errors import ConfigError

#: A size: digits, or digits with a decimal exponent (``1e6``), a whole number either way.
_SIZE = r"([0-9]+(?:[eE][0-9]+)?)"
_SHAPE_RE = re.compile(rf"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*{_SIZE}\s*(?:\.\.\s*{_SIZE})?\s*$")
#: The largest size a ``--shape`` range may reach: torch holds sizes as signed 64-bit integers. Ranges
#: far below it can still be refused by :func:`check_fits`, which knows the model's memory.
MAX_SIZE = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class ShapeRange:
    """One named dynamic size and the inclusive range it spans in deployment."""

    name: str
    low: int
    high: int

    def points(self, count: int) -> tuple[int, ...]:
        """``count`` sizes spread geometrically over the range (ends included)."""
        if self.low == self.high or count <= 1:
            return (self.high,) if count <= 1 else (self.low,)
        ratio = (self.high / self.low) ** (1 / (count - 1)) if self.low > 0 else None
        out = {self.low, self.high}
        for i in range(1, count - 1):
            out.add(round(self.low * ratio**i) if ratio else round(self.high * i / (count - 1)))
        return tuple(sorted(out))


def _size(digits: str, text: str) -> int:
    """A whole size from ``4096`` or ``1e6``; one over :data:`MAX_SIZE` is a ConfigError (checked before
    ``10**exponent`` or a long digit string is ever made into a number)."""
    mantissa, _, exponent = digits.lower().partition("e")
    mantissa = mantissa.lstrip("0") or "0"
    magnitude = len(mantissa) + int(exponent or 0) if mantissa != "0" else 0
    if magnitude > len(str(MAX_SIZE)) or (value := int(mantissa + "0" * int(exponent or 0))) > MAX_SIZE:
        raise ConfigError(f"invalid shape {text!r}: {digits} is more than {MAX_SIZE} (2**63 - 1), the largest "
                          "size torch can hold")
    return value


def parse_shape(text: str) -> ShapeRange:
    """``batch=1..4096`` (or ``batch=64``, ``batch=1..1e6``) -> ShapeRange; a ConfigError names a bad value."""
    match = _SHAPE_RE.match(text)
    if not match:
        raise ConfigError(f"invalid shape {text!r} (expected NAME=MIN..MAX, e.g. batch=1..4096)")
    name, low = match.group(1), _size(match.group(2), text)
    high = _size(match.group(3), text) if match.group(3) else low
    if low > high:
        raise ConfigError(f"invalid shape {text!r}: min {low} is greater than max {high}")
    if low < 1:
        raise ConfigError(f"invalid shape {text!r}: sizes must be at least 1")
    return ShapeRange(name, low, high)


def shape_points(shapes: tuple[ShapeRange, ...], count: int) -> Iterator[dict[str, int]]:
    """Every combination of each family's points."""
    names = [s.name for s in shapes]
    for values in itertools.product(*(s.points(count) for s in shapes)):
        yield dict(zip(names, values))


#: The keys a warm spec may hold, each the name of a ``prescreen warm`` parameter (``-`` as ``_``), and the type
#: its value must have; the value itself is checked by the option's click type, as a command-line value is.
SPEC_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "target": ((str,), "a string"), "shapes": ((Mapping,), "a table of NAME = 'MIN..MAX'"),
    "plans": ((str,), "a string"), "device": ((str,), "a string"), "device_kind": ((str,), "a string"),
    "device_memory": ((str, int), 'a size such as "64GiB" or a byte count'),
    "ratio": ((str, int, float), "a number in (0, 1]"), "mode": ((str,), "a string"),
    "points": ((int,), "a whole number"), "inductor_config": ((str, list, Mapping), "a table, a list of "
                                                              "'KEY=VALUE' strings or one such string"),
}
SPEC_KEYS = tuple(SPEC_TYPES)

#: Leading text of a ``KEY=VALUE`` item (a dotted Inductor key such as ``triton.cudagraphs`` included).
_ITEM_START = re.compile(r",\s*(?=[A-Za-z_][A-Za-z0-9_.]*\s*=)")


def split_inductor_config(value: str | list[str] | Mapping[str, object]) -> tuple[str, ...]:
    """``KEY=VALUE`` items from a spec's ``inductor_config``: a table, a list of items, or one string of items
    separated by commas (a comma inside a value, ``max_autotune_gemm_backends=ATEN,TRITON``, stays in it)."""
    if isinstance(value, str):
        return tuple(item.strip() for item in _ITEM_START.split(value) if item.strip())
    if isinstance(value, Mapping):
        return tuple(f"{k}={v}" for k, v in value.items())
    return tuple(str(v) for v in value)


def _spec_shape(name: str, value: object, where: str) -> ShapeRange:
    if isinstance(value, Mapping) and set(value) == {"min", "max"} and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        value = f"{value['min']}..{value['max']}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{where}: shape {name!r} must be 'MIN..MAX' or {{min = MIN, max = MAX}} (whole numbers), "
                          f"got {value!r}")
    try:
        return parse_shape(f"{name}={value}")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_spec(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON warm spec's settings by parameter name (shapes parsed, inductor_config split into items): an
    unknown key, a value of the wrong type or a bad shape is a ConfigError; ``warm``'s option types check the rest."""
    p = Path(path)
    where = f"spec {str(p)!r}"
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read spec {str(p)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not a text file") from None
    try:
        if p.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        fmt = "TOML" if p.suffix == ".toml" else "JSON"
        raise ConfigError(f"{where} is not valid {fmt}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table/object")
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        hints = [f"{k!r} (did you mean {k.replace('-', '_')!r}?)" if k.replace("-", "_") in SPEC_KEYS else repr(k)
                 for k in unknown]
        raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)} "
                          f"(known: {', '.join(SPEC_KEYS)})")
    for key, value in data.items():
        types, what = SPEC_TYPES[key]
        if isinstance(value, bool) or not isinstance(value, types) or (
                isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: {key!r} must be {what}, got {value!r}")
    spec = dict(data)
    if "shapes" in spec:
        spec["shapes"] = tuple(_spec_shape(k, v, where) for k, v in spec["shapes"].items())
    if "inductor_config" in spec:
        spec["inductor_config"] = split_inductor_config(spec["inductor_config"])
    return spec


def load_target(spec: str) -> Callable[..., Any]:
    """``package.module:callable`` or ``path/to/file.py:callable``."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(f"invalid target {spec!r} (expected module:callable or file.py:callable)")
    try:
        if module_part.endswith(".py") or "/" in module_part:
            path = Path(module_part)
            if not path.is_file():
                raise ConfigError(f"invalid target {spec!r}: no file {module_part!r}")
            name = f"prescreen_target_{abs(hash(str(path.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_part)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"invalid target {spec!r}: cannot import {module_part!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"invalid target {spec!r}: {module_part!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def build(fn: Callable[..., Any], sizes: Mapping[str, int], device: str) -> tuple[Any, tuple[Any, ...]]:
    """Call the target with the sizes (and ``device`` if it takes one): (model, inputs)."""
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = dict(sizes)
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in params and not accepts_any]
    if unknown:
        raise ConfigError(f"target takes no size named {unknown[0]!r} (it takes: {', '.join(params) or 'nothing'})")
    if "device" in params or accepts_any:
        kwargs["device"] = device
    try:
        result = fn(**kwargs)
    except Exception as exc:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn
        call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ConfigError(f"target {name}({call}) raised {type(exc).__name__}: {first_line(exc)}") from None
    if isinstance(result, Mapping):
        model, inputs = result.get("model"), result.get("inputs", ())
    elif isinstance(result, tuple) and len(result) == 2:
        model, inputs = result
    else:
        raise ConfigError("target must return (model, inputs) or {'model': ..., 'inputs': ...}")
    if not callable(model):
        raise ConfigError("target returned a model that is not callable")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return model, inputs


def first_line(exc: BaseException) -> str:
    """The first non-blank line of ``exc``'s message: an error line holds one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def split_item(item: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` -> (key, value), checked for form only (no torch import)."""
    name, sep, raw = item.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"invalid inductor config {item!r} (expected KEY=VALUE, e.g. freezing=True)")
    return name, raw.strip()


def merge_inductor_config(*layers: tuple[str, ...]) -> tuple[str, ...]:
    """The items of every layer, a later layer's KEY replacing an earlier one's (the command line last)."""
    merged: dict[str, str] = {}
    for layer in layers:
        for item in layer:
            name, raw = split_item(item)
            merged.pop(name, None)
            merged[name] = f"{name}={raw}"
    return tuple(merged.values())


def available_memory(device: str) -> tuple[int, str] | None:
    """Bytes free on ``device`` for warm's model and example inputs, and what the figure is; None where it
    cannot be told. The host's ``MemAvailable`` for ``cpu``; the device's free memory for others."""
    import torch

    kind = torch.device(device).type
    if kind == "cpu":
        try:
            with open("/proc/meminfo") as f:
                line = next(line for line in f if line.startswith("MemAvailable:"))
            return int(line.split()[1]) * 1024, "available host memory"
        except (OSError, ValueError, IndexError, StopIteration):
            return None
    mem_get_info = getattr(getattr(torch, kind, None), "mem_get_info", None)
    if mem_get_info is None:
        return None
    try:
        return int(mem_get_info(device)[0]), f"free {kind} memory"
    except Exception:
        return None


def tensors_of(model: Any, inputs: tuple[Any, ...]) -> list[Any]:
    """The tensors a compile sees: the inputs', then the parameters and buffers of the model (or of the modules a
    callable wrapper holds)."""
    import torch
    from torch.utils._pytree import tree_leaves

    held = [model] if isinstance(model, torch.nn.Module) else \
        [v for v in getattr(model, "__dict__", {}).values() if isinstance(v, torch.nn.Module)]  # a wrapper's
    return [t for t in tree_leaves(list(inputs)) if isinstance(t, torch.Tensor)] + \
        [t for module in held for t in (*module.parameters(), *module.buffers())]


def build_on_meta(fn: Callable[..., Any], sizes: Mapping[str, int]) -> tuple[Any, tuple[Any, ...]]:
    """``build`` on torch's meta device (shapes only: nothing allocated, no weights initialized). Raises what the
    build raises; ValueError where the target put a tensor on a real device of its own choosing."""
    import torch

    with torch.device("meta"):
        model, inputs = build(fn, sizes, "meta")
    if any(t.device.type != "meta" for t in tensors_of(model, inputs)):
        raise ValueError("the target builds on a device of its own")
    return model, inputs


def _meta_bytes(fn: Callable[..., Any], sizes: Mapping[str, int]) -> int:
    """The bytes of the model's parameters and buffers and its example inputs at ``sizes``, built on the meta
    device (nothing can be told without allocating where that raises)."""
    return sum(t.numel() * t.element_size() for t in tensors_of(*build_on_meta(fn, sizes)))


def check_fits(fn: Callable[..., Any], grid: list[dict[str, int]], device: str) -> None:
    """Refuse, before anything is allocated, a warm whose largest sizes cannot fit (``batch=1..1e12`` would grow
    until the host kills it): the model's parameters, buffers and example inputs at the largest sizes, built on
    the meta device, must fit in ``available_memory`` (a lower bound: the forward pass needs more). A target that
    cannot build on the meta device at all is not checked."""
    named = [sizes for sizes in grid if sizes]
    if not named:
        return
    smallest = {name: min(p[name] for p in named) for name in named[0]}
    largest = {name: max(p[name] for p in named) for name in named[0]}
    try:
        _meta_bytes(fn, smallest)
    except Exception:
        return  # not buildable on the meta device: the real build says what is wrong, if anything
    at = ", ".join(f"{k}={v}" for k, v in largest.items())
    try:
        need = _meta_bytes(fn, largest)
    except Exception as exc:
        why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {first_line(exc)}"
        raise ConfigError(f"the largest sizes are too large: measuring the model at {at} on the meta device failed "
                          f"({why}); narrow --shape") from None
    have = available_memory(device)
    if have is not None and need > have[0]:
        from prescreen.budget import format_bytes

        raise ConfigError(f"warm at {at} needs at least {format_bytes(need)} ({need} bytes) for the model and its "
                          f"example inputs, more than the {format_bytes(have[0])} of {have[1]} on {device}; "
                          "narrow --shape")


def check_device(device: str) -> None:
    """A ConfigError saying why, unless torch can build a model on ``device`` here."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(f"--device {device!r} is not a device: {first_line(exc)}") from None
    is_available = getattr(getattr(torch, kind, None), "is_available", None)
    if kind not in ("cpu", "meta") and (is_available is None or not is_available()):
        raise ConfigError(f"--device {device!r}: no {kind} device is available to this torch build "
                          f"({torch.__version__}); use --device cpu, or --plans to decide for another device")


def parse_inductor_config(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["freezing=True", "max_autotune_gemm_backends=ATEN"]`` -> checked Inductor config overrides."""
    from torch._inductor import config

    out: dict[str, Any] = {}
    for item in items:
        name, raw = split_item(item)
        try:
            current: Any = config
            for part in name.split("."):
                current = getattr(current, part)
        except AttributeError:
            raise ConfigError(f"invalid inductor config {item!r}: torch._inductor.config has no {name!r}") from None
        if isinstance(current, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ConfigError(f"invalid inductor config {item!r}: {name} takes a boolean")
            out[name] = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int):
            try:
                out[name] = int(raw)
            except ValueError:
                raise ConfigError(f"invalid inductor config {item!r}: {name} takes an integer") from None
        else:
            out[name] = raw
    return out

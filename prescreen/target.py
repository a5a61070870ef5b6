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

_SHAPE_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([0-9]+)\s*(?:\.\.\s*([0-9]+))?\s*$")


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


def parse_shape(text: str) -> ShapeRange:
    """``batch=1..4096`` (or ``batch=64``) -> ShapeRange; a ConfigError names a bad value."""
    match = _SHAPE_RE.match(text)
    if not match:
        raise ConfigError(f"invalid shape {text!r} (expected NAME=MIN..MAX, e.g. batch=1..4096)")
    name, low, high = match.group(1), int(match.group(2)), int(match.group(3) or match.group(2))
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


def load_spec(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON warm spec: target, shapes, device_memory, ratio, mode, points."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read spec {str(p)!r}: {exc.strerror}") from None
    try:
        if p.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"spec {str(p)!r} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"spec {str(p)!r} must be a table/object")
    shapes = data.get("shapes", {})
    if not isinstance(shapes, Mapping):
        raise ConfigError(f"spec {str(p)!r}: 'shapes' must map names to 'MIN..MAX'")
    out = dict(data)
    out["shapes"] = tuple(
        parse_shape(f"{k}={v['min']}..{v['max']}" if isinstance(v, Mapping) else f"{k}={v}") for k, v in shapes.items()
    )
    return out


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
    return fn


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
    result = fn(**kwargs)
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




def parse_inductor_config(items: list[str]) -> dict[str, Any]:
    """``["freezing=True", "max_autotune_gemm_backends=ATEN"]`` -> checked Inductor config overrides."""
    from torch._inductor import config

    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"invalid inductor config {item!r} (expected KEY=VALUE, e.g. freezing=True)")
        try:
            current = getattr(config, name)
        except AttributeError:
            raise ConfigError(f"invalid inductor config {item!r}: torch._inductor.config has no {name!r}") from None
        raw = raw.strip()
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

"""Whether the torch_npu grouped-footprint code in this process is the code prescreen mirrors.

prescreen's representatives and footprint follow torch-npu 2.14.0's
``symbolic_grouping`` (checked against the released wheel by the differential
tests). Ascend's master changes that code (``choose_symbolic_axis_value`` rounds
a closed bucket of a product with static axes down where 2.14.0 rounds up, and
drops a bucket no value reaches) while a source build of it still calls itself
2.14.0: ``2.14.0+git<sha>``, or 2.14.0 with no distribution metadata at all. So
a version says nothing about the code, and the code is checked where it is used:
the ``symbolic_grouping`` functions torch_npu's guard actually calls (read from
the guard's module globals) are prescreen's only where

1. the source of every function and class prescreen mirrors (``MIRRORED_NAMES``)
   parses to the same syntax tree as 2.14.0's (layout and comments do not
   count): ``MIRRORED_DIGESTS``;
2. run on a probe plan whose closed buckets 2.14.0 and master solve differently,
   they give 2.14.0's representatives and bytes (``PROBE_*``); and
3. the installed distribution, if there is one, is of the 2.14 series (a
   version, local label or none, never counts as a match by itself: 1 and 2
   decide).

Anywhere else the hook makes no decision of its own and calls torch_npu's guard.
A verdict is kept per set of function objects, so it is reached once per module.
The torch_npu version is part of every key, so entries made under one build are
never reused under another.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import linecache
import re
import sys
import threading
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, Union

#: The release whose code prescreen mirrors.
MIRRORED_RELEASE = "2.14.0"
#: torch_npu release series (major.minor) an installed distribution may report.
MIRRORED_SERIES = "2.14"
#: Where torch_npu keeps the functions below.
GROUPING_MODULE = "torch_npu._inductor.runtime.symbolic_grouping"
#: The functions the guard calls, and the module's functions and classes they use.
ENTRY_NAMES = ("build_group_representatives", "estimate_grouped_benchmark_footprint")
MIRRORED_NAMES = (
    *ENTRY_NAMES, "evaluate_grouped_benchmark_expr", "required_storage_numel",
    "_grouped_benchmark_dtype_itemsize", "_feature_field",
    "UnsupportedGroupedPlan", "GroupedBenchmarkFootprint", "GroupedBenchmarkArgFootprint",
)
#: Each one's ``tree_digest`` in the torch-npu 2.14.0 wheel (the same on Python 3.10 to 3.13).
MIRRORED_DIGESTS: dict[str, str] = {
    "build_group_representatives": "4ab1517b025ae4807b7c1c684e2e37cb",
    "estimate_grouped_benchmark_footprint": "ecd0b42e1008d3ccb7d1d7c4f9f38ad0",
    "evaluate_grouped_benchmark_expr": "5a9b1a1c15a6bf58a8b284289a313c28",
    "required_storage_numel": "f5459414f44a1b63dae587c7bccbc763",
    "_grouped_benchmark_dtype_itemsize": "20cd52c8ac2b010bc70aa127a2d6cb83",
    "_feature_field": "ae71e3777d2c14a41da21aa51ab76879",
    "UnsupportedGroupedPlan": "4b9bc3d80dad5eab5d4b52336c6a3d2a",
    "GroupedBenchmarkFootprint": "a796c4e4160689afd29e5e0f88166630",
    "GroupedBenchmarkArgFootprint": "766e4b2b3b15b539365578d2311a9376",
}

#: The probe: one feature over ``x0 * x1`` (x1 = 64 static) with closed buckets at 100 and 1000, where
#: 2.14.0 takes x0 = ceil(100 / 64) = 2 and ceil(1000 / 64) = 16 (master: 1 and 15), an open bucket
#: (x0 = 32), and a feature over a static axis only, whose other bucket no group reaches.
PROBE_FEATURES = (
    {"name": "outer", "source": "outer_product", "axis_names": ("x0", "x1"), "buckets": (100, 1000)},
    {"name": "reduction", "source": "reduction_product", "axis_names": ("r0_",), "buckets": (8,)},
)
PROBE_AXES = ("x0", "x1", "r0_")
PROBE_STATICS = (("x1", 64), ("r0_", 4))
PROBE_ARGS = (
    {"kind": "tensor", "source": "buffer", "name": "in_ptr0", "dtype": "torch.float16",
     "size_exprs": ({"add": ({"axis_name": "x0"}, {"const": -1})}, {"axis_name": "x1"}),
     "stride_exprs": ({"axis_name": "x1"}, 1)},
    {"kind": "workspace", "source": "workspace", "name": "ws",
     "count_expr": {"floordiv": ({"mul": ({"axis_name": "x0"}, 3)}, {"axis_name": "r0_"})}, "dtype": "torch.int32"},
    {"kind": "size", "source": "axis_expr", "name": "xnumel", "expr": {"axis_name": "x0"}},
)
PROBE_MUTATED = ("in_ptr0",)
#: 2.14.0's answer: reachable groups, each one's axis values, and the footprint's total bytes.
PROBE_REACHABLE = (0, 1, 2)
PROBE_AXIS_VALUES = ((("x0", 2), ("x1", 64), ("r0_", 4)), (("x0", 16), ("x1", 64), ("r0_", 4)),
                     (("x0", 32), ("x1", 64), ("r0_", 4)))
PROBE_TOTAL_BYTES = 10132

_SERIES_RE = re.compile(r"^\s*(\d+)\.(\d+)")


@functools.cache
def installed_npu_version() -> str | None:
    """The installed torch_npu distribution's version, or None when there is no distribution metadata."""
    for dist in ("torch_npu", "torch-npu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=16)
def series_allows(version: str | None) -> bool:
    """False where an installed distribution names another release series; a 2.14 label or none is no proof."""
    if version is None:
        return True
    match = _SERIES_RE.match(version)
    return match is not None and f"{match.group(1)}.{match.group(2)}" == MIRRORED_SERIES


def _canonical(node: object) -> object:
    """A syntax tree as nested tuples, without what differs between Python versions for the same code.

    Positions are not fields; empty and missing fields are left out (3.12 added
    ``type_params``; 3.13's nodes default more fields), so one digest holds for
    Python 3.10 to 3.13.
    """
    if isinstance(node, ast.AST):
        return (type(node).__name__, tuple((name, _canonical(value)) for name, value in ast.iter_fields(node)
                                           if value is not None and value != [] and name != "type_comment"))
    if isinstance(node, list):
        return tuple(_canonical(item) for item in node)
    return node


def tree_digest(node: ast.AST) -> str:
    """sha256 (first 32 hex digits) of a definition's syntax tree (its decorators and body; not where it is)."""
    return hashlib.sha256(repr(_canonical(node)).encode()).hexdigest()[:32]


Definition = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]


def _first_line(node: Definition) -> int:
    return node.decorator_list[0].lineno if node.decorator_list else node.lineno


def _defined_by(obj: object, node: Definition, filename: str) -> bool:
    """Whether ``obj`` is the object that ``node`` of ``filename`` defines (not one rebound under its name)."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return bool(code.co_filename == filename and code.co_firstlineno == _first_line(node))
    if not isinstance(obj, type) or obj.__qualname__ != node.name:
        return False
    first = getattr(obj, "__firstlineno__", None)  # Python 3.13: its first decorator's line
    return getattr(sys.modules.get(obj.__module__), "__file__", None) == filename and first in (None, _first_line(node))


def module_digests(module: Mapping[str, Any]) -> dict[str, str]:
    """The ``tree_digest`` of each of ``MIRRORED_NAMES`` as the module's source file defines it.

    The file is parsed once; each name's object must be the one defined there.
    Raises ``LookupError`` naming what is missing and ``OSError`` where the
    source cannot be read (a build shipping only bytecode: not checkable, so
    not mirrored).
    """
    entry = module.get(ENTRY_NAMES[0])
    filename = getattr(getattr(entry, "__code__", None), "co_filename", None)
    lines = linecache.getlines(filename) if isinstance(filename, str) else []
    if not lines:
        raise OSError(f"no source file for {filename or ENTRY_NAMES[0]}")
    tree = ast.parse("".join(lines))
    defined = {node.name: node for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    digests = {}
    for name in MIRRORED_NAMES:
        node = defined.get(name)
        if node is None or not _defined_by(module.get(name), node, filename):  # type: ignore[arg-type]
            raise LookupError(f"its {name} is not defined in {filename}")
        digests[name] = tree_digest(node)
    return digests


def module_namespace(names: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The globals of the module ``names["build_group_representatives"]`` comes from, or None."""
    found = getattr(names.get(ENTRY_NAMES[0]), "__globals__", None)
    return found if found.__class__ is dict or isinstance(found, Mapping) else None


def _differs(module: Mapping[str, Any]) -> str | None:
    """Which mirrored function or class is not 2.14.0's, or None."""
    try:
        digests = module_digests(module)
    except LookupError as exc:
        return str(exc.args[0])
    except (OSError, SyntaxError, ValueError) as exc:
        return f"its source cannot be read ({exc})"
    differ = [name for name in MIRRORED_NAMES if digests[name] != MIRRORED_DIGESTS[name]]
    return f"its {', '.join(differ)} differ from {MIRRORED_RELEASE}'s" if differ else None


def probe(module: Mapping[str, Any]) -> str | None:
    """How the module's functions answer the probe plan differently from 2.14.0, or None."""
    try:
        build: Callable[..., Any] = module[ENTRY_NAMES[0]]
        estimate: Callable[..., Any] = module[ENTRY_NAMES[1]]
        reps = build(copy.deepcopy(PROBE_FEATURES), PROBE_AXES, PROBE_STATICS)  # copies: foreign code may edit them
        reachable = tuple(reps["reachable_group_ids"])
        axis_values = tuple(tuple(reps["benchmark_axis_values_by_group"][g]) for g in reachable)
        total = estimate(reps, copy.deepcopy(PROBE_ARGS), PROBE_MUTATED).total_bytes
    except Exception as exc:  # foreign code: whatever it raises, it is not 2.14.0's
        return f"the probe plan raised {type(exc).__name__}: {exc}"
    if (reachable, axis_values, total) != (PROBE_REACHABLE, PROBE_AXIS_VALUES, PROBE_TOTAL_BYTES):
        return (f"on the probe plan it gives groups {reachable}, axis values {axis_values} and {total} bytes "
                f"where {MIRRORED_RELEASE} gives {PROBE_REACHABLE}, {PROBE_AXIS_VALUES} and {PROBE_TOTAL_BYTES}")
    return None


_verdicts: dict[tuple[object, ...], str | None] = {}
_verdicts_lock = threading.Lock()
_UNSEEN = "\0"


def _code_verdict(names: Mapping[str, Any]) -> str | None:
    """Why the grouping code ``names`` calls is not 2.14.0's, or None where it is.

    Kept per tuple of the module's mirrored objects, so the check runs once per
    module (and again if one of them is rebound); a hit costs a few dict reads.
    """
    module = module_namespace(names)
    if module is None:
        return f"it has no {ENTRY_NAMES[0]} function to check"
    # the caller's other imports must be that module's: a name rebound in the caller is another function
    for name in _CALLER_NAMES:
        if name in names and names[name] is not module.get(name):
            return f"the caller's {name} is not that module's"
    objects = tuple(map(module.get, MIRRORED_NAMES))
    try:
        verdict = _verdicts.get(objects, _UNSEEN)
    except TypeError:  # an unhashable object under a mirrored name: not a function or class, so not 2.14.0's
        return "a mirrored name holds neither a function nor a class"
    if verdict == _UNSEEN:
        with _verdicts_lock:
            verdict = _verdicts.get(objects, _UNSEEN)
            if verdict == _UNSEEN:
                verdict = _verdicts[objects] = _differs(module) or probe(module)
    return verdict


_CALLER_NAMES = (ENTRY_NAMES[1], "UnsupportedGroupedPlan")


def why_not_mirrored(names: Mapping[str, Any], version: str | None) -> str | None:
    """None where the grouping code ``names`` (a caller's globals) calls is the code prescreen mirrors; else why not.

    ``version``: the installed torch_npu distribution's (``installed_npu_version``).
    """
    if not series_allows(version):
        return f"torch_npu {version} is not a {MIRRORED_SERIES} release, whose grouped-footprint code prescreen mirrors"
    why = _code_verdict(names)
    if why is None:
        return None
    module = module_namespace(names) or {}
    where = module.get("__file__") or module.get("__name__") or "not found"
    return (f"torch_npu's symbolic_grouping ({where}; version {version or 'without metadata'}) is not the "
            f"torch-npu {MIRRORED_RELEASE} code prescreen mirrors: {why}")

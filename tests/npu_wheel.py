"""Obtain the real torch-npu 2.14.0 wheel and load pieces of it standalone.

The wheel needs Ascend's CANN runtime to import as a whole, but a few of its
Python files stand alone: ``torch_npu/_inductor/runtime/symbolic_grouping.py``
imports only torch and sympy. This module finds the wheel (``$PRESCREEN_NPU_WHEEL_DIR``
or ``.npu-wheel/`` at the repo root), downloads it with pip when it is missing,
reads sources out of it with zipfile and loads ``symbolic_grouping`` under a
private module name. Nothing from the wheel is installed or kept in the repo.

Usage from a test::

    try:
        upstream = load_upstream_symbolic_grouping()
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
"""

from __future__ import annotations

import ast
import atexit
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import zipfile
from pathlib import Path
from types import ModuleType

NPU_VERSION = "2.14.0"
WHEEL_GLOB = f"torch_npu-{NPU_VERSION}-*.whl"
WHEEL_DIR_ENV = "PRESCREEN_NPU_WHEEL_DIR"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WHEEL_DIR = REPO_ROOT / ".npu-wheel"
SYMBOLIC_GROUPING = "torch_npu/_inductor/runtime/symbolic_grouping.py"
CODEGEN_TRITON = "torch_npu/_inductor/codegen/triton.py"
NPU_CONFIG = "torch_npu/_inductor/config.py"
MODULE_NAME = "_prescreen_upstream_symbolic_grouping"
DOWNLOAD_TIMEOUT_S = 600


class WheelUnavailable(RuntimeError):
    """The wheel could not be found or fetched; the message says why."""


_last_error: str | None = None


def _wheel_dirs() -> list[Path]:
    env = os.environ.get(WHEEL_DIR_ENV)
    dirs = [Path(env)] if env else []
    return [*dirs, DEFAULT_WHEEL_DIR]


def _find_wheel() -> Path | None:
    for folder in _wheel_dirs():
        if folder.is_dir():
            for path in sorted(folder.glob(WHEEL_GLOB)):
                if zipfile.is_zipfile(path):
                    return path
    return None


def _download() -> Path | None:
    """``pip download --no-deps torch_npu==2.14.0`` into the wheel dir (atomically)."""
    global _last_error
    env = os.environ.get(WHEEL_DIR_ENV)
    target = Path(env) if env else DEFAULT_WHEEL_DIR
    try:
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=target))
    except OSError as exc:
        _last_error = f"cannot create wheel dir {target}: {exc}"
        return None
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--no-input", "--progress-bar", "off", f"torch_npu=={NPU_VERSION}", "-d", str(staging),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            _last_error = f"`{' '.join(cmd[2:])}` failed (rc={proc.returncode}): {' | '.join(tail)}"
            return None
        for path in staging.glob(WHEEL_GLOB):
            if zipfile.is_zipfile(path):
                final = target / path.name
                os.replace(path, final)
                return final
        _last_error = f"pip download produced no {WHEEL_GLOB} in {staging}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        _last_error = f"pip download failed: {exc}"
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@functools.cache
def npu_wheel_path() -> Path | None:
    """The torch-npu 2.14.0 wheel: found locally, else downloaded; None when neither works."""
    return _find_wheel() or _download()


def unavailable_reason() -> str:
    """Why ``npu_wheel_path()`` returned None."""
    dirs = ", ".join(str(d) for d in _wheel_dirs())
    return f"torch-npu {NPU_VERSION} wheel unavailable (looked in {dirs}): {_last_error or 'not found'}"


def _require_wheel() -> Path:
    path = npu_wheel_path()
    if path is None:
        raise WheelUnavailable(unavailable_reason())
    return path


def upstream_source(relpath: str) -> str:
    """Text of one file in the wheel, e.g. ``torch_npu/_inductor/codegen/triton.py``."""
    name = relpath if relpath.startswith("torch_npu/") else f"torch_npu/{relpath}"
    with zipfile.ZipFile(_require_wheel()) as wheel:
        try:
            return wheel.read(name).decode("utf-8")
        except KeyError:
            raise WheelUnavailable(f"{name} is not in {wheel.filename}") from None


@functools.cache
def _extract_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="prescreen-npu-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.cache
def load_upstream_symbolic_grouping() -> ModuleType:
    """torch_npu's ``symbolic_grouping`` module, loaded standalone under a private name."""
    path = _extract_dir() / "symbolic_grouping.py"
    path.write_text(upstream_source(SYMBOLIC_GROUPING), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has a loader
        raise WheelUnavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(MODULE_NAME, None)
        raise
    return module


#: The NPU kernel class and the methods of it the hook wraps.
NPU_CLASS = "NPUIndexTritonKernel"
GUARD_METHODS = ("_disable_grouped_autotune_if_benchmark_too_large", "_disable_grouped_autotune")


def _top_level_source(source: str, names: set[str]) -> str:
    """The top-level function definitions and assignments named in ``names``, as source."""
    tree = ast.parse(source)
    parts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            parts.append(ast.get_source_segment(source, node))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            parts.append(ast.get_source_segment(source, node))
    return "\n\n".join(p for p in parts if p)


def import_upstream_npu_config() -> types.SimpleNamespace:
    """torch_npu's Inductor config ratio, computed as importing ``torch_npu._inductor.config`` does now.

    The config module needs CANN to import as a whole; its env parser and the
    ``symbolic_group_max_benchmark_memory_ratio`` assignment are executed
    from the wheel's source, so the variable is read once, at this "import".
    """
    source = upstream_source(NPU_CONFIG)
    code = _top_level_source(source, {"_parse_float_env", "symbolic_group_max_benchmark_memory_ratio"})
    namespace: dict[str, object] = {"os": os, "log": logging.getLogger("upstream.config")}
    exec(code, namespace)  # noqa: S102 - the wheel's own code, run as torch_npu runs it
    return types.SimpleNamespace(symbolic_group_max_benchmark_memory_ratio=namespace[
        "symbolic_group_max_benchmark_memory_ratio"])


def upstream_kernel_class(total_memory: dict[str, int], config: object) -> tuple[type, dict[str, object]]:
    """A class with torch_npu's own guard methods, executed from the wheel with its ``symbolic_grouping``.

    ``torch.npu.get_device_properties`` reports ``total_memory["total"]``; the
    methods read ``npu_config`` from the returned namespace (swap it to change
    the config object they see).
    """
    grouping = load_upstream_symbolic_grouping()
    source = upstream_source(CODEGEN_TRITON)
    tree = ast.parse(source)
    cls_node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == NPU_CLASS)
    fake_torch = types.SimpleNamespace(npu=types.SimpleNamespace(
        get_device_properties=lambda _d: types.SimpleNamespace(total_memory=total_memory["total"])))
    namespace: dict[str, object] = {
        "build_group_representatives": grouping.build_group_representatives,
        "estimate_grouped_benchmark_footprint": grouping.estimate_grouped_benchmark_footprint,
        "UnsupportedGroupedPlan": grouping.UnsupportedGroupedPlan,
        "torch": fake_torch,
        "npu_config": config,
        "log": logging.getLogger("upstream"),
    }
    body = {}
    for fn in cls_node.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in GUARD_METHODS:
            exec(textwrap.dedent(ast.get_source_segment(source, fn, padded=True) or ""), namespace)  # noqa: S102
            body[fn.name] = namespace[fn.name]
    missing = set(GUARD_METHODS) - set(body)
    if missing:
        raise WheelUnavailable(f"{NPU_CLASS} in the wheel lacks {sorted(missing)}")
    return type("UpstreamKernel", (), body), namespace


# --- torch_npu's grouped runtime autotuner, from the wheel's runtime/triton_heuristics.py --------------------

TRITON_HEURISTICS = "torch_npu/_inductor/runtime/triton_heuristics.py"
#: Classes taken whole from the wheel (every method theirs).
RUNTIME_CLASSES = ("_NPUSkipPrecompilePlugin", "NPUCachingAutotuner", "NPUSymbolicGroupedAutotuner")
#: Module-level functions taken from the wheel: the grouped candidate-plan builder and what it and the
#: autotuner call.
RUNTIME_FUNCTIONS = (
    "_triton_config_npu_index_grouped", "build_grouped_launch_policy", "resolve_grouped_runtime_block",
    "strip_runtime_blocks_from_cfg", "extract_runtime_blocks_from_cfg", "build_candidate_plan",
    "_select_prerun_top_candidates", "_measure_prerun_ms",
)


class StandInConfig:
    """``triton.Config`` as the grouped path reads it (Triton is not installed here): kwargs, warps, stages, pre_hook."""

    def __init__(self, kwargs: dict[str, object], num_warps: int = 4, num_stages: int = 2, **_: object) -> None:
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.pre_hook = None

    def __repr__(self) -> str:
        return f"Config({self.kwargs}, num_warps={self.num_warps}, num_stages={self.num_stages})"


class StandInDeviceInterface:
    """The device interface ``get_device_interface()`` returns, on the host: one device, stream 0."""

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_raw_stream(_device: int) -> int:
        return 0

    @staticmethod
    def synchronize(_device: int | None = None) -> None:
        return None

    @staticmethod
    def exchange_device(device: int) -> int:
        return device

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return device


class StandInCachingAutotuner:
    """torch's ``CachingAutotuner``, reduced to the attributes and methods torch_npu's classes use on this path.

    The wheel needs torch 2.14 (CI has 2.13 without Triton), so the base class is
    this stand-in: ``__init__`` sets what torch's sets (``fn``, ``triton_meta``
    with the device index, ``configs``, ``inductor_meta``, ``mutated_arg_names``,
    ``heuristic_type``, ``compile_results``, ``launchers``, ``lock``, ...);
    ``clone_args`` clones the mutated arguments (``maybe_clone_args``), through
    ``allocate_clone`` so a test can account for and fail that allocation.
    """

    def __init__(self, fn: object, triton_meta: dict[str, object], configs: list[object], save_cache_hook: object,
                 mutated_arg_names: list[str], optimize_mem: bool, heuristic_type: object,
                 size_hints: object = None, inductor_meta: dict[str, object] | None = None,
                 custom_kernel: bool = False, filename: str | None = None,
                 reset_to_zero_arg_names: list[str] | None = None,
                 autotune_cache_info: dict[str, object] | None = None) -> None:
        import threading

        self.fn = fn
        self.triton_meta = {**triton_meta, "device": 0, "device_type": "npu"}
        self.inductor_meta = {} if inductor_meta is None else inductor_meta
        self.save_cache_hook = save_cache_hook
        self.mutated_arg_names = mutated_arg_names
        self.reset_to_zero_arg_names = [] if reset_to_zero_arg_names is None else reset_to_zero_arg_names
        self.optimize_mem = optimize_mem
        self.configs = configs
        self.heuristic_type = heuristic_type
        self.custom_kernel = custom_kernel
        self.cuda_kernel_saved = False
        self.autotune_cache_info = autotune_cache_info
        self.compile_results: list[object] = []
        self.launchers: list[object] = []
        self.lock = threading.Lock()
        self.size_hints = size_hints
        self.filename = filename
        self.precompile_time_taken_ns = 0
        self.dump_launch_params = False
        self.triton_interpret = False
        self._plugins: list[object] = []

    @property
    def arg_names(self) -> list[str]:
        return list(self.fn.arg_names)  # type: ignore[attr-defined]

    def get_device_interface(self) -> type[StandInDeviceInterface]:
        return StandInDeviceInterface

    def allocate_clone(self, tensor: object) -> object:
        return tensor.clone()  # type: ignore[attr-defined]

    def clone_args(self, *args: object, **kwargs: object) -> tuple[list[object], dict[str, object]]:
        names = list(self.fn.arg_names)  # type: ignore[attr-defined]
        cloned = [self.allocate_clone(arg) if i < len(names) and names[i] in self.mutated_arg_names
                  and hasattr(arg, "clone") else arg for i, arg in enumerate(args)]
        return cloned, dict(kwargs)

    def reset_to_zero_args(self, *args: object, **kwargs: object) -> None:
        return None


def _config_functions(config_cls: type) -> tuple[object, object]:
    """torch's own ``config_to_dict`` / ``config_from_dict``, rebound to ``config_cls`` (no Triton here)."""
    from torch._inductor.runtime import triton_heuristics as th

    names = {**vars(th), "Config": config_cls}
    to_dict = types.FunctionType(th.config_to_dict.__code__, names, "config_to_dict")
    from_dict = types.FunctionType(th.config_from_dict.__code__, names, "config_from_dict")
    return to_dict, from_dict


def upstream_grouped_runtime(npu_config: object, benchmarker: object,
                             legacy_configs: object) -> dict[str, object]:
    """torch_npu's grouped runtime autotuner, executed from the wheel over stand-ins for what needs CANN or Triton.

    From the wheel (every line theirs): the classes ``NPUCachingAutotuner`` and
    ``NPUSymbolicGroupedAutotuner`` whole, and the plan builder
    ``_triton_config_npu_index_grouped`` with the launch-policy and block helpers
    (``RUNTIME_FUNCTIONS``), with the wheel's ``symbolic_grouping``. Stand-ins
    (named ``StandIn*``): the base ``CachingAutotuner``, ``triton.Config``, the
    device interface, ``npu_config`` (``npu_config``), the Triton benchmarker
    (``benchmarker.benchmark_gpu``) and the per-size config generator
    ``_triton_config_npu_index_legacy`` (``legacy_configs(size_hints, inductor_meta)``,
    which needs TileGenerator). A subclass supplies ``_precompile_config`` (the
    Triton compile). Returns the namespace the code runs in.
    """
    import copy
    import functools
    import time
    import typing

    import torch
    from torch._dynamo.testing import rand_strided
    from torch._inductor import config as inductor_config
    from torch._inductor.runtime.hints import HeuristicType
    from torch._inductor.runtime.triton_heuristics import DEFER, CachingAutotunerPlugin
    from torch.utils._ordered_set import OrderedSet

    grouping = load_upstream_symbolic_grouping()
    source = upstream_source(TRITON_HEURISTICS)
    tree = ast.parse(source)
    to_dict, from_dict = _config_functions(StandInConfig)

    class NoTritonConfigsError(RuntimeError):
        pass

    def legacy(size_hints: object, inductor_meta: object, **_: object) -> object:
        return legacy_configs(size_hints, inductor_meta)  # type: ignore[operator]

    namespace: dict[str, object] = {
        "__name__": "_prescreen_upstream_triton_heuristics",
        **{name: getattr(typing, name) for name in ("Any", "Dict", "List", "Optional", "Union", "Literal")},
        "copy": copy, "functools": functools, "lru_cache": functools.lru_cache, "time": time, "logging": logging,
        "os": os, "torch": torch, "rand_strided": rand_strided, "config": inductor_config,
        "HeuristicType": HeuristicType, "DEFER": DEFER, "CachingAutotunerPlugin": CachingAutotunerPlugin,
        "CachingAutotuner": StandInCachingAutotuner, "Config": StandInConfig, "TritonCompileResultNpu": object,
        "OrderedSet": OrderedSet, "config_to_dict": to_dict, "config_from_dict": from_dict,
        "NoTritonConfigsError": NoTritonConfigsError, "builtins": __import__("builtins"),
        "UnsupportedGroupedPlan": grouping.UnsupportedGroupedPlan, "bucketize": grouping.bucketize,
        "build_group_representatives": grouping.build_group_representatives,
        "find_primary_feature_index": grouping.find_primary_feature_index,
        "is_open_bucket_group": grouping.is_open_bucket_group,
        "npu_config": npu_config, "log": logging.getLogger("upstream.triton_heuristics"),
        "autotune_continue_on_failure": False, "benchmarker": benchmarker,
        "npu_profiler_session_active": lambda: False, "warning_once": lambda _log, *a, **k: None,
        "_triton_config_npu_index_legacy": legacy,
    }
    wanted = set(RUNTIME_CLASSES) | set(RUNTIME_FUNCTIONS)
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted:
            exec(ast.get_source_segment(source, node) or "", namespace)  # noqa: S102 - the wheel's own code
            found.add(node.name)
    missing = wanted - found
    if missing:
        raise WheelUnavailable(f"{TRITON_HEURISTICS} in the wheel lacks {sorted(missing)}")
    return namespace

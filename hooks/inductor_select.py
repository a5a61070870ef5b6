"""Guard Inductor's max-autotune algorithm selection (CPU and CUDA).

``AlgorithmSelectorCache.__call__`` benchmarks every choice on example inputs
it synthesizes from the size hints of the symbolic input and output layouts
(``benchmark_example_value`` -> ``rand_strided``). The guard builds the plan of
those inputs straight off the IR at every selection (as Inductor's own
``key_of`` does), decides with the shared estimator, budget and store, and over
budget hands the selector only the ATen extern choice, which it returns without
benchmarking. ``autotune`` is wrapped for the OOM retry, ``lookup`` so that the
retry's answer is never written to Inductor's autotune cache as timings.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from prescreen import families
from prescreen.errors import NotBounded
from prescreen.expr import Const, Expr, expr_from_sympy
from prescreen.hooks import oom, state
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import lookup_or_decide

__all__ = [
    "CONV_WORKSPACE_COPIES", "GPU_SLACK_BYTES", "TRITON_FLUSH_BYTES", "benchmark_plan", "concrete_tensor_arg",
    "extern_workspace_copies", "flush_buffer_bytes", "patch", "plan_for_selection", "unpatch",
]

log = logging.getLogger("prescreen.hooks")

ORIGINAL_ATTR = "_prescreen_original_call"


def _hint_fn(sizevars: Any) -> Callable[[Any], int]:
    """Concrete hint of one expression, across Inductor versions."""
    from torch._inductor import config

    fallback = int(getattr(config, "unbacked_symint_fallback", 8192))
    if hasattr(sizevars, "optimization_hint"):  # torch >= 2.12
        return lambda e: int(sizevars.optimization_hint(e, fallback=fallback))
    return lambda e: int(sizevars.size_hint(e, fallback=fallback))  # torch 2.11


def _strides_of(node: Any) -> Sequence[Any]:
    try:
        from torch._inductor.select_algorithm import get_strides_with_layout_constraints

        strides: Sequence[Any] = get_strides_with_layout_constraints(node)  # type: ignore[no-untyped-call]
    except (ImportError, AttributeError, TypeError):
        strides = node.get_stride()
    return strides


def _source_name(shape_env: Any, sym: Any) -> str | None:
    """What the user calls a symbol when ``warm`` cannot name it: its first source, e.g. ``L['x'].size()[0]``."""
    try:
        source = shape_env.var_to_sources[sym][0]
        name = source.name() if callable(source.name) else source.name
        return str(name) or None
    except Exception:
        return None


def _grows(e: Any) -> bool:
    """True when ``e`` cannot shrink as its (non-negative) symbols grow.

    Only such an expression may be estimated at a bucket's upper bound: sums,
    products with non-negative constants, positive powers and floor division by a
    positive constant of growing terms. Anything else (``64 - s0``, ``4096 // s0``,
    an unknown function) is not known to grow, so it is taken at the hint.
    """
    if not e.free_symbols or isinstance(e, sympy.Symbol):
        return True
    if isinstance(e, sympy.Add):
        return all(_grows(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        return all(_grows(a) if a.free_symbols else bool(a >= 0) for a in e.args)
    if isinstance(e, sympy.Pow):
        return isinstance(e.exp, sympy.Integer) and int(e.exp) >= 1 and _grows(e.base)
    if isinstance(e, sympy.floor) and len(e.args) == 1:
        return _grows(e.args[0])
    if any(cls.__name__ == "FloorDiv" for cls in type(e).__mro__) and len(e.args) == 2:
        num, den = e.args
        return _grows(num) and not den.free_symbols and bool(den > 0)
    return False


class _Converter:
    """Turns IR sizes into expressions over axes named after their symbols, for one plan.

    Each symbol's value is the upper bound of its hint's shape family
    (``prescreen.families``, read under the ShapeEnv's current range), so the plan,
    and the key, is the same for every hint in the bucket and the estimate never
    undercounts one of them. An expression the estimator cannot read, or one not
    known to grow with its symbols (``_grows``), is taken at the hint itself (its
    plan keys by the hint).

    One converter serves the plans of one guarded step: each symbol's family is
    read once, and each plan's axes are the symbols met since the last plan
    (``benchmark_plan``).
    """

    def __init__(self, sizevars: Any, scheme: families.Scheme | None = None) -> None:
        self.hint = _hint_fn(sizevars)
        self.shape_env = getattr(sizevars, "shape_env", None)
        self.scheme = families.active_scheme() if scheme is None else scheme
        self.statics: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.axes: set[str] = set()

    def _family(self, sym: Any) -> int:
        """``sym``'s value in plans (its bucket's bound, or its hint), its label recorded."""
        hint = self.hint(sym)
        bucket = families.bucket_for(hint, self.scheme, *families.symbol_range(self.shape_env, sym))
        if hint not in bucket or (bucket.exact and self.scheme.kind == "exact"):
            return hint
        named = families.name_for(hint)
        self.labels[sym.name] = bucket.describe(named or _source_name(self.shape_env, sym) or sym.name)
        return bucket.high

    def expr(self, e: Any) -> Expr:
        if isinstance(e, int):
            return Const(int(e))
        e = sympy.sympify(e)
        for sym in e.free_symbols:
            if sym.name not in self.statics:
                self.statics[sym.name] = self._family(sym)
            self.axes.add(sym.name)
        try:
            converted = expr_from_sympy(e)
        except NotBounded:
            return Const(self.hint(e))  # the benchmark uses the concrete hint anyway
        return converted if _grows(e) else Const(self.hint(e))

    def tensor(self, name: str, node: Any, layout: Any) -> list[TensorArg | WorkspaceArg]:
        """The argument(s) ``rand_strided`` allocates for ``node``: its storage, and its offset if any."""
        from torch._inductor.virtualized import V

        size = list(node.get_size())
        try:
            alloc = V.graph.get_allocation_size(node)
            if alloc is not None and list(alloc) != size:
                size = list(alloc)
        except (AttributeError, TypeError, AssertionError):
            pass
        dtype, device = str(node.get_dtype()), str(node.get_device())
        args: list[TensorArg | WorkspaceArg] = [
            TensorArg(name=name, source="buffer", size=tuple(self.expr(s) for s in size),
                      stride=tuple(self.expr(s) for s in _strides_of(node)), dtype=dtype, device=device)
        ]
        offset = self.expr(getattr(layout, "offset", 0))
        if offset != Const(0):  # rand_strided allocates the offset as extra elements
            args.append(WorkspaceArg(f"{name}.offset", offset, dtype, device, "NONE"))
        return args


#: Small scratch buffers and allocator rounding seen on top of inputs, output and
#: flush (1 MiB measured for addmm on an H200); kept so the guard never undercounts.
GPU_SLACK_BYTES = 2 * 2**20

#: Triton's do_bench flush buffer, which Inductor keeps on ROCm.
TRITON_FLUSH_BYTES = 256 * 2**20

#: (device type, index) -> its flush buffer's bytes: a device query, and a device's L2 size never changes
_flush_bytes: dict[tuple[str, int], int] = {}


def flush_buffer_bytes(device: Any) -> int:
    """Bytes the GPU benchmarker allocates to flush the L2 cache between timings (0 on CPU).

    Inductor's GPU benchmarker flushes with an L2-sized buffer on CUDA (measured
    on an H200 with torch 2.11: exactly the 60 MiB L2) and with Triton's 256 MiB
    one on ROCm; an unknown L2 size counts as 256 MiB. Read once per device.
    """
    kind = getattr(device, "type", "cpu")
    if kind in ("cpu", "meta"):
        return 0
    try:
        import torch

        if torch.version.hip:
            return TRITON_FLUSH_BYTES
        backend = getattr(torch, kind)
        index = device.index if device.index is not None else int(backend.current_device())
        found = _flush_bytes.get((kind, index))
        if found is None:
            l2 = int(getattr(backend.get_device_properties(index), "L2_cache_size", 0) or 0)
            found = _flush_bytes[(kind, index)] = l2 or TRITON_FLUSH_BYTES
        return found
    except Exception:
        return TRITON_FLUSH_BYTES


#: cuDNN's workspace for the ATen convolution choice, allocated through the caching
#: allocator while that choice is benchmarked (not an input or output, so not in the
#: plan otherwise), in copies of (input + output). Measured on an H200 (torch 2.11,
#: fp16, bench/gpu_coverage.py): 2x (input + output) for contiguous conv2d and conv3d
#: (cuDNN runs NHWC kernels and transposes both), 1x for channels-last conv2d.
CONV_WORKSPACE_COPIES = {"contiguous": 2, "channels_last": 1}

#: Selections whose ATen extern choice needs a library workspace on GPUs.
_WORKSPACE_OPS = ("convolution",)


def _channels_last(conv: _Converter, node: Any) -> bool:
    """Channel dim (1) has stride 1 with more than one channel: NHWC / NDHWC / NLC."""
    try:
        size, stride = list(node.get_size()), list(_strides_of(node))
        return len(size) >= 3 and conv.hint(stride[1]) == 1 and conv.hint(size[1]) > 1
    except Exception:
        return False


def extern_workspace_copies(name: str, device: Any, conv: _Converter | None = None, node: Any = None) -> int:
    """Copies of (input + output) the extern choice of selection ``name`` needs as workspace (0 on CPU)."""
    if getattr(device, "type", "cpu") in ("cpu", "meta") or name not in _WORKSPACE_OPS:
        return 0
    if conv is not None and node is not None and _channels_last(conv, node):
        return CONV_WORKSPACE_COPIES["channels_last"]
    return CONV_WORKSPACE_COPIES["contiguous"]


def plan_for_selection(name: str, input_nodes: Sequence[Any], layout: Any) -> KernelPlan:
    """The benchmark plan of one algorithm selection: unique inputs plus the output."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    conv = _Converter(V.graph.sizevars)
    args: list[TensorArg | WorkspaceArg] = []
    seen: set[str] = set()
    first: Any = None
    for i, node in enumerate(input_nodes):
        node_name = node.get_name()
        if node_name in seen:
            continue
        seen.add(node_name)
        base = node.unwrap_view() if isinstance(node, ir.BaseView) else node
        first = base if first is None else first
        args.extend(conv.tensor(f"input{i}", base, base.get_layout()))
    out = ir.Buffer(name="prescreen_out", layout=layout)
    args.extend(conv.tensor("output", out, layout))
    for copy in range(extern_workspace_copies(name, layout.device, conv, first) if first is not None else 0):
        # the library workspace, in copies of (input + output): sized by the same expressions
        args.extend(conv.tensor(f"extern_workspace{copy}.input0", first, first.get_layout()))
        args.extend(conv.tensor(f"extern_workspace{copy}.output", out, layout))
    return benchmark_plan(conv, args, layout.device, f"select:{name}")


def benchmark_plan(conv: _Converter, args: list[TensorArg | WorkspaceArg], device: Any, kernel_name: str) -> KernelPlan:
    """A plan of ``args`` plus the GPU benchmarker's flush buffer and slack, over the axes ``conv`` met since its
    last plan."""
    flush = flush_buffer_bytes(device)
    if flush:
        dev = str(device)
        args.append(WorkspaceArg("benchmark.cache_flush", Const(flush), "torch.uint8", dev, "NONE"))
        args.append(WorkspaceArg("benchmark.slack", Const(GPU_SLACK_BYTES), "torch.uint8", dev, "NONE"))
    axes = tuple(sorted(conv.axes))
    conv.axes = set()
    return KernelPlan(
        group_features=(),
        axis_names=axes,
        axis_static_values=tuple((a, conv.statics[a]) for a in axes),
        args=tuple(args),
        kernel_name=kernel_name,
        axis_labels=tuple((a, conv.labels[a]) for a in axes if a in conv.labels),
    )


def concrete_tensor_arg(label: str, tensor: Any) -> TensorArg:
    """A plan argument for a real tensor: its own sizes, strides, dtype and device."""
    return TensorArg(name=label, source="buffer", size=tuple(Const(int(d)) for d in tensor.size()),
                     stride=tuple(Const(int(s)) for s in tensor.stride()), dtype=str(tensor.dtype),
                     device=str(tensor.device))


def _fallback_choice(choices: Sequence[Any]) -> Any | None:
    from torch._inductor.select_algorithm import ExternKernelCaller

    for choice in choices:
        if isinstance(choice, ExternKernelCaller):
            return choice
    return None


def _all_timings_cached(selector: Any, name: str, choices: list[Any], input_nodes: Sequence[Any]) -> bool:
    """Whether Inductor's local autotune cache already holds a timing for every choice: upstream then
    benchmarks nothing (``PersistentCache.lookup`` answers from the cache), so there is nothing to guard.

    CUTLASS choices are left out of this shortcut: upstream may benchmark them to read their workspace."""
    from torch._inductor.select_algorithm import create_inputs_key

    if any("CUTLASS" in type(c).__name__ for c in choices):
        return False
    timings = selector.lookup(choices, name, create_inputs_key(input_nodes), None)
    return bool(timings) and all(c in timings for c in choices)


def _guard(selector: Any, name: str, choices: list[Any], input_nodes: Sequence[Any], layout: Any) -> list[Any]:
    """Return the choices to hand upstream: all of them, or just the fallback."""
    if len(choices) <= 1:
        return choices
    fallback = _fallback_choice(choices)
    if fallback is None:
        return choices  # nothing safe to fall back to: upstream behaviour
    plan = plan_for_selection(name, input_nodes, layout)
    outcome = lookup_or_decide(plan, state.budget_for(layout.device), state.get_store())
    decision = outcome.decision
    if state.plan_only():
        return [fallback]  # decided and recorded; nothing is benchmarked
    if decision.tune:
        return choices
    try:
        if _all_timings_cached(selector, name, choices, input_nodes):
            state.log_once(f"cached:{outcome.key}", logging.INFO,
                           "prescreen: %s would fall back (%s), but Inductor's autotune cache holds a timing for "
                           "each of its %d choices: upstream chooses without benchmarking", name,
                           decision.reason, len(choices))
            return choices
    except Exception as exc:  # an unreadable cache: the decision stands
        log.debug("prescreen: autotune cache not read for %s (%r)", name, exc)
    state.log_once(outcome.key, logging.WARNING,
                   "prescreen: skipping autotune benchmark for %s (%d choices), using %s: %s [key %s, %s]",
                   name, len(choices), getattr(fallback, "name", type(fallback).__name__), decision.reason,
                   outcome.key[:12], "store hit" if outcome.hit else "computed")
    return [fallback]


_CALL_PARAMS = ("self", "name", "choices", "input_nodes", "layout")
_AUTOTUNE_PARAMS = ("self", "name", "input_nodes", "layout", "input_gen_fns", "choices")
_LOOKUP_PARAMS = ("self", "choices", "op", "inputs", "benchmark")


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded_call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
            arguments = bound.arguments
            arguments["choices"] = _guard(arguments["self"], arguments["name"], list(arguments["choices"]),
                                          arguments["input_nodes"], arguments["layout"])
            args, kwargs = bound.args, bound.kwargs
        except Exception as exc:  # never break a compile
            state.log_once(f"select-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: select-algorithm guard failed (%r); autotuning as upstream would", exc)
        return original(*args, **kwargs)

    setattr(guarded_call, ORIGINAL_ATTR, original)
    return guarded_call


def _wrap_autotune(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autotune`` (where the selection's inputs are synthesized and benchmarked), with an OOM retry.

    On an out-of-memory error the step's tensors are released and the ATen
    extern choice is returned as the winner (timing 0, every other choice
    inf), which is what upstream does with that one choice: no benchmark.
    """
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded_autotune(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            if not oom.is_oom(exc):
                raise
            try:
                bound = signature.bind(*args, **kwargs)
                name, input_nodes, layout = (bound.arguments[k] for k in ("name", "input_nodes", "layout"))
                choices = list(bound.arguments["choices"])
            except Exception:
                raise exc from None
            fallback = _fallback_choice(choices)
            if fallback is None:
                raise  # nothing upstream offers to fall back to
            info = oom.info(exc, layout.device)
        oom.release(layout.device)  # the failed step's frames are gone once the except block ends
        oom.record(lambda: [plan_for_selection(name, input_nodes, layout)], layout.device, info,
                   f"the autotune benchmark of {name} ({len(choices)} choices)",
                   getattr(fallback, "name", type(fallback).__name__))
        timings = {c: (0.0 if c is fallback else float("inf")) for c in choices}
        if getattr(_lookups, "depth", 0):
            raise _FellBack(timings)  # through upstream's lookup, which then writes none of them
        return timings

    setattr(guarded_autotune, ORIGINAL_ATTR, original)
    return guarded_autotune


class _FellBack(Exception):
    """An OOM retry's answer, carried past ``PersistentCache.lookup`` so it is never written as timings."""

    def __init__(self, timings: dict[Any, float]) -> None:
        super().__init__("prescreen: fell back after an out-of-memory benchmark")
        self.timings = timings


#: How many ``lookup`` calls are running on this thread (an OOM retry inside one raises ``_FellBack``).
_lookups = threading.local()


def _wrap_lookup(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AlgorithmSelectorCache.lookup`` (``PersistentCache.lookup``): upstream writes whatever its benchmark
    returns to the local autotune cache. After an OOM retry those are not timings (0 for ATen, inf for the
    rest): written, they would make every later compile pick ATen with no benchmark, whatever prescreen
    decides then. The retry's answer is returned here instead, and nothing is written."""

    @functools.wraps(original)
    def guarded_lookup(self: Any, choices: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_lookups, "depth", 0)
        _lookups.depth = depth + 1
        try:
            return original(self, choices, *args, **kwargs)
        except _FellBack as fell:
            return {c: fell.timings.get(c, float("inf")) for c in choices}
        finally:
            _lookups.depth = depth

    setattr(guarded_lookup, ORIGINAL_ATTR, original)
    return guarded_lookup


def _params_ok(fn: Callable[..., Any], expected: tuple[str, ...]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return tuple(params[: len(expected)]) == expected


def patch_attr(cls: Any, attr: str, expected: tuple[str, ...], wrap: Callable[..., Any], what: str) -> bool:
    """Wrap ``cls.attr`` once; an Inductor whose method takes other parameters is left alone, with a warning."""
    import torch

    current = getattr(cls, attr, None)
    if current is None:
        log.warning("prescreen: torch %s has no %s.%s; the %s guard is not installed",
                    torch.__version__, cls.__name__, attr, what)
        return False
    if hasattr(current, ORIGINAL_ATTR):
        return True
    if not _params_ok(current, expected):
        log.warning("prescreen: %s.%s in torch %s does not take (%s); the %s guard is not installed",
                    cls.__name__, attr, torch.__version__, ", ".join(expected[1:]), what)
        return False
    setattr(cls, attr, wrap(current))
    return True


def unpatch_attr(cls: Any, attr: str) -> None:
    original = getattr(getattr(cls, attr, None), ORIGINAL_ATTR, None)
    if original is not None:
        setattr(cls, attr, original)


def patch() -> bool:
    """Install the guards on Inductor's algorithm selection; True if the selection guard is installed.

    ``AlgorithmSelectorCache.__call__`` (the decision), ``.autotune`` (the OOM
    retry), ``.lookup`` (no retry answer cached as timings), the epilogue-fusion
    guard (``prescreen.hooks.inductor_fusion``) and Triton's runtime autotuning
    (``prescreen.hooks.triton_autotune``).
    """
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    from prescreen.hooks import inductor_fusion, triton_autotune

    ok = patch_attr(AlgorithmSelectorCache, "__call__", _CALL_PARAMS, _wrap, "select-algorithm")
    if ok:
        patch_attr(AlgorithmSelectorCache, "autotune", _AUTOTUNE_PARAMS, _wrap_autotune, "autotune OOM-retry")
        patch_attr(AlgorithmSelectorCache, "lookup", _LOOKUP_PARAMS, _wrap_lookup, "autotune-cache")
        inductor_fusion.patch()
    triton_autotune.patch()
    return ok


def unpatch() -> None:
    """Restore upstream's methods."""
    import sys

    from prescreen.hooks import inductor_fusion, triton_autotune

    module = sys.modules.get("torch._inductor.select_algorithm")
    if module is not None:
        for attr in ("__call__", "autotune", "lookup"):
            unpatch_attr(module.AlgorithmSelectorCache, attr)
    inductor_fusion.unpatch()
    triton_autotune.unpatch()

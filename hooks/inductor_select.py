"""Guard Inductor's max-autotune algorithm selection (CPU and CUDA).

``AlgorithmSelectorCache.__call__`` benchmarks every choice on inputs synthesized from size hints: the guard
builds their plan off the IR (as ``key_of`` does) and, over budget, hands over only the ATen extern choice.
``autotune`` is wrapped for the OOM retry, ``lookup`` so that the retry's answer is never written as timings.
With ``autotune_in_subproc`` a subprocess answers an OOM and upstream times that choice inf: ``TuningProcess.get``
is wrapped so that the fact is stored all the same.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sympy

from prescreen import families
from prescreen.errors import NotBounded
from prescreen.expr import Const, Expr, expr_from_sympy, grows
from prescreen.hooks import oom, state
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import lookup_or_decide

__all__ = [
    "CONV_WORKSPACE_COPIES", "GPU_SLACK_BYTES", "TRITON_FLUSH_BYTES", "benchmark_buffers", "benchmark_plan",
    "concrete_tensor_arg", "extern_workspace_copies", "flush_buffer_bytes", "patch", "patch_attr",
    "plan_for_selection", "unpatch", "unpatch_attr",
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


class _Converter:
    """Turns IR sizes into expressions over axes named after their symbols, each at its hint's shape-family bound
    (``prescreen.families``, within the ShapeEnv's range) so no hint in the bucket is undercounted; what the
    estimator cannot read, or is not known to grow (``expr.grows``), is taken at the hint. One per guarded step."""

    def __init__(self, sizevars: Any, scheme: families.Scheme | None = None) -> None:
        self.hint = _hint_fn(sizevars)
        self.shape_env = getattr(sizevars, "shape_env", None)
        self.scheme = families.active_scheme() if scheme is None else scheme
        self.statics: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.axes: set[str] = set()
        self._converted: dict[Any, tuple[Expr, list[str]]] = {}

    def _family(self, sym: Any) -> int:
        """``sym``'s value in plans (its bucket's bound, or its hint), its label recorded."""
        hint = families.retarget(self.hint(sym))
        bucket = self.scheme.bucket(hint).clamp(*families.symbol_range(self.shape_env, sym))
        if hint not in bucket or (bucket.exact and self.scheme.kind == "exact"):
            return hint
        named = families.name_for(hint)
        self.labels[sym.name] = bucket.describe(named or _source_name(self.shape_env, sym) or sym.name)
        return bucket.high

    def expr(self, e: Any) -> Expr:
        """``e`` over axes; each distinct expression converted once (a fusion step's buffers share a few)."""
        if isinstance(e, int):
            return Const(int(e))
        if e not in self._converted:
            self._converted[e] = self._convert(sympy.sympify(e))
        converted, names = self._converted[e]
        self.axes.update(names)
        return converted

    def _convert(self, e: Any) -> tuple[Expr, list[str]]:
        for sym in e.free_symbols:
            if sym.name not in self.statics:
                self.statics[sym.name] = self._family(sym)
        names = [sym.name for sym in e.free_symbols]
        try:
            converted = expr_from_sympy(e)
        except NotBounded:
            return self._at_hint(e), names  # the benchmark uses the concrete hint anyway
        return converted if grows(converted) else self._at_hint(e), names

    def _at_hint(self, e: Any) -> Const:
        if any(families.retarget(h) != h for h in map(self.hint, e.free_symbols)):
            raise families.NotRetargetable(f"{e} is taken at its hint")
        return Const(self.hint(e))

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
    """Bytes the GPU benchmarker allocates to flush the L2 cache between timings (0 on CPU): an L2-sized buffer
    on CUDA (the 60 MiB L2 measured on an H200, torch 2.11), Triton's 256 MiB on ROCm or where L2 is unknown."""
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


#: cuDNN's workspace for the ATen convolution choice, in copies of (input + output) and of the weight, measured
#: with torch 2.11, fp16 (bench/gpu_coverage.py). Contiguous: 2 copies of (input + output) on an H200, and one
#: of the weight, ResNet-50's 512x512x3x3 on 7x7 (H100) reading exactly that much over them, as if its NHWC
#: kernels transform the filter too. Channels-last: 1 copy of (input + output).
CONV_WORKSPACE_COPIES = {"contiguous": (2, 1), "channels_last": (1, 0)}


def extern_workspace_copies(name: str, device: Any, conv: _Converter | None = None,
                            node: Any = None) -> tuple[int, int]:
    """Copies of (input + output), and of the weight, the extern choice of selection ``name`` needs as workspace
    (none on CPU)."""
    if getattr(device, "type", "cpu") in ("cpu", "meta") or name != "convolution":
        return 0, 0
    try:  # channels last: channel dim (1) of stride 1 with more than one channel (NHWC / NDHWC / NLC)
        size, stride = list(node.get_size()), list(_strides_of(node))
        if conv is not None and len(size) >= 3 and conv.hint(stride[1]) == 1 and conv.hint(size[1]) > 1:
            return CONV_WORKSPACE_COPIES["channels_last"]
    except Exception:
        pass
    return CONV_WORKSPACE_COPIES["contiguous"]


def plan_for_selection(name: str, input_nodes: Sequence[Any], layout: Any) -> KernelPlan:
    """The benchmark plan of one algorithm selection: unique inputs plus the output."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    conv = _Converter(V.graph.sizevars)
    args: list[TensorArg | WorkspaceArg] = []
    seen: set[str] = set()
    bases: list[Any] = []
    for i, node in enumerate(input_nodes):
        node_name = node.get_name()
        if node_name in seen:
            continue
        seen.add(node_name)
        base = node.unwrap_view() if isinstance(node, ir.BaseView) else node
        bases.append(base)
        args.extend(conv.tensor(f"input{i}", base, base.get_layout()))
    out = ir.Buffer(name="prescreen_out", layout=layout)
    args.extend(conv.tensor("output", out, layout))
    copies, weight_copies = extern_workspace_copies(name, layout.device, conv, bases[0]) if bases else (0, 0)
    for copy in range(copies):  # the library workspace, sized by the same expressions
        args.extend(conv.tensor(f"extern_workspace{copy}.input0", bases[0], bases[0].get_layout()))
        args.extend(conv.tensor(f"extern_workspace{copy}.output", out, layout))
    for copy in range(weight_copies if len(bases) > 1 else 0):  # convolution(input, weight[, bias])
        args.extend(conv.tensor(f"extern_workspace{copy}.input1", bases[1], bases[1].get_layout()))
    return benchmark_plan(conv, args, layout.device, f"select:{name}")


def benchmark_buffers(device: Any) -> list[WorkspaceArg]:
    """The GPU benchmarker's flush buffer and slack (none on CPU)."""
    flush = flush_buffer_bytes(device)
    if not flush:
        return []
    return [WorkspaceArg("benchmark.cache_flush", Const(flush), "torch.uint8", str(device), "NONE"),
            WorkspaceArg("benchmark.slack", Const(GPU_SLACK_BYTES), "torch.uint8", str(device), "NONE")]


def benchmark_plan(conv: _Converter, args: list[TensorArg | WorkspaceArg], device: Any, kernel_name: str) -> KernelPlan:
    """A plan of ``args`` plus the benchmark's buffers, over the axes ``conv`` met since its last plan."""
    axes = tuple(sorted(conv.axes))
    conv.axes = set()
    return KernelPlan(group_features=(), axis_names=axes, axis_static_values=tuple((a, conv.statics[a]) for a in axes),
                      args=(*args, *benchmark_buffers(device)), kernel_name=kernel_name,
                      axis_labels=tuple((a, conv.labels[a]) for a in axes if a in conv.labels))


def concrete_tensor_arg(label: str, tensor: Any) -> TensorArg:
    """A plan argument for a real tensor: its own sizes, strides, dtype and device."""
    return TensorArg(name=label, source="buffer", size=tuple(Const(int(d)) for d in tensor.size()),
                     stride=tuple(Const(int(s)) for s in tensor.stride()), dtype=str(tensor.dtype),
                     device=str(tensor.device))


def _fallback_choice(choices: Sequence[Any]) -> Any | None:
    """The ATen extern choice, the one upstream offers that benchmarks nothing alone."""
    from torch._inductor.select_algorithm import ExternKernelCaller

    return next((c for c in choices if isinstance(c, ExternKernelCaller)), None)


def _all_timings_cached(selector: Any, name: str, choices: list[Any], input_nodes: Sequence[Any]) -> bool:
    """Whether Inductor's local autotune cache holds a timing for every choice: upstream then benchmarks
    nothing. Not for CUTLASS choices, which upstream may benchmark to read their workspace."""
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
        for target in families.also_deciding():  # the same plan at other families' sizes
            with families.retargeting(target):
                lookup_or_decide(plan_for_selection(name, input_nodes, layout), state.budget_for(layout.device),
                                 state.get_store())
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
_GET_PARAMS = ("self", "timeout")


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

    return guarded_call


def _wrap_autotune(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autotune`` (where the inputs are synthesized and benchmarked): on an OOM, the ATen extern choice
    wins (timing 0, every other inf), as upstream does with that one choice alone."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded_autotune(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
            name, input_nodes, layout, choices = (bound[k] for k in ("name", "input_nodes", "layout", "choices"))
            fallback = _fallback_choice(choices)
        except Exception:
            fallback = None
        if fallback is None:  # nothing upstream offers to fall back to
            return original(*args, **kwargs)

        def aten_wins() -> dict[Any, float]:
            timings = {c: (0.0 if c is fallback else float("inf")) for c in choices}
            if getattr(_lookups, "depth", 0):
                raise _FellBack(timings)  # through upstream's lookup, which then writes none of them
            return timings

        def plans() -> list[KernelPlan]:
            return [plan_for_selection(name, input_nodes, layout)]

        what = f"the autotune benchmark of {name} ({len(choices)} choices)"

        def store(answered: oom.Info) -> None:  # upstream timed those choices inf: the fact is stored all the same
            requested, _, error = answered
            oom.record(plans, layout.device, (requested, oom.free_bytes(layout.device), error),
                       f"{what}, in an autotune subprocess,", "upstream timed those choices inf")

        with _subprocess_ooms(store):
            return oom.retry(lambda: original(*args, **kwargs), aten_wins, layout.device, plans, what,
                             getattr(fallback, "name", type(fallback).__name__))

    return guarded_autotune


#: OOMs the autotune subprocesses sent back (``TuningProcess.get``, on ``TuningProcessPool``'s threads) while
#: guarded ``autotune`` calls ran, and how many run (a compile runs one at a time).
_answered: list[oom.Info] = []
_running = [0]
_answered_lock = threading.Lock()


@contextlib.contextmanager
def _subprocess_ooms(store: Callable[[oom.Info], None]) -> Iterator[None]:
    """``store`` the first OOM the autotune subprocesses (``autotune_in_subproc``) answered while the block ran,
    once it ends, however it ends: upstream turns each into an inf timing and a warning, so no error is seen."""
    with _answered_lock:
        _running[0] += 1
        first = len(_answered)
    try:
        yield
    finally:
        with _answered_lock:
            seen = _answered[first:]
            _running[0] -= 1
            if not _running[0]:
                _answered.clear()
        if seen:
            store(seen[0])


def _wrap_process_get(original: Callable[..., Any]) -> Callable[..., Any]:
    """``TuningProcess.get`` re-raises the error its subprocess sent back: an OOM is noted while a guard runs."""

    @functools.wraps(original)
    def guarded_get(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            if oom.is_oom(exc):
                with _answered_lock:
                    if _running[0]:
                        _answered.append(oom.info(exc, None))
            raise

    return guarded_get


class _FellBack(Exception):
    """An OOM retry's answer, carried past ``PersistentCache.lookup`` so it is never written as timings."""

    def __init__(self, timings: dict[Any, float]) -> None:
        super().__init__("prescreen: fell back after an out-of-memory benchmark")
        self.timings = timings


#: How many ``lookup`` calls are running on this thread (an OOM retry inside one raises ``_FellBack``).
_lookups = threading.local()


def _wrap_lookup(original: Callable[..., Any]) -> Callable[..., Any]:
    """``lookup`` writes what its benchmark returns to the local autotune cache: an OOM retry's answer written
    there would make every later compile pick ATen unbenchmarked, whatever its budget. It is returned instead."""

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

    return guarded_lookup


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
    try:
        params = tuple(inspect.signature(current).parameters)[: len(expected)]
    except (TypeError, ValueError):
        params = ()
    if params != expected:
        log.warning("prescreen: %s.%s in torch %s does not take (%s); the %s guard is not installed",
                    cls.__name__, attr, torch.__version__, ", ".join(expected[1:]), what)
        return False
    wrapped = wrap(current)
    setattr(wrapped, ORIGINAL_ATTR, current)
    setattr(cls, attr, wrapped)
    return True


def unpatch_attr(cls: Any, *attrs: str) -> None:
    """Put back upstream's methods where ``patch_attr`` wrapped them."""
    for attr in attrs:
        original = getattr(getattr(cls, attr, None), ORIGINAL_ATTR, None)
        if original is not None:
            setattr(cls, attr, original)


def patch() -> bool:
    """Install the guards on ``AlgorithmSelectorCache`` (``__call__`` decides, ``autotune`` retries an OOM,
    ``lookup`` caches no retry), the autotune subprocesses' answers, epilogue fusion and Triton runtime
    autotuning; True if selection is guarded."""
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    from prescreen.hooks import inductor_fusion, triton_autotune

    ok = patch_attr(AlgorithmSelectorCache, "__call__", _CALL_PARAMS, _wrap, "select-algorithm")
    if ok:
        patch_attr(AlgorithmSelectorCache, "autotune", _AUTOTUNE_PARAMS, _wrap_autotune, "autotune OOM-retry")
        patch_attr(AlgorithmSelectorCache, "lookup", _LOOKUP_PARAMS, _wrap_lookup, "autotune-cache")
        from torch._inductor.autotune_process import TuningProcess

        patch_attr(TuningProcess, "get", _GET_PARAMS, _wrap_process_get, "autotune-subprocess OOM")
        inductor_fusion.patch()
    triton_autotune.patch()
    return ok


def unpatch() -> None:
    """Restore upstream's methods."""
    import sys

    from prescreen.hooks import inductor_fusion, triton_autotune

    module = sys.modules.get("torch._inductor.select_algorithm")
    if module is not None:
        unpatch_attr(module.AlgorithmSelectorCache, "__call__", "autotune", "lookup")
    subprocesses = sys.modules.get("torch._inductor.autotune_process")
    if subprocesses is not None:
        unpatch_attr(subprocesses.TuningProcess, "get")
    inductor_fusion.unpatch()
    triton_autotune.unpatch()

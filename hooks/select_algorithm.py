"""Guard Inductor's max-autotune algorithm selection (CPU and CUDA).

``AlgorithmSelectorCache.__call__`` benchmarks every choice on example inputs
it synthesizes from the size hints of the symbolic input and output layouts
(``benchmark_example_value`` -> ``rand_strided``). The guard estimates those
bytes with the same estimator, budget and store; over budget it hands the
selector only the ATen extern choice, which it returns without benchmarking.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from prescreen import families
from prescreen.errors import NotBounded
from prescreen.expr import Const, Expr, expr_from_sympy
from prescreen.hooks import oom, state
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import lookup_or_decide

log = logging.getLogger("prescreen.hooks")

_ORIGINAL_ATTR = "_prescreen_original_call"


def _hint_fns(sizevars: Any) -> Callable[[Any], int]:
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


class _SymbolFacts:
    """What plans of one graph read of its symbols and sizes, read once: reading a hint (a sympy
    substitution) or a value range (``ShapeEnv.bound_sympy``), and converting a size, is most of
    building a plan, and every selection and fusion step of the graph reads the same few.

    A hint never changes during a graph's lowering. A symbol's shape family (its value in plans, its
    label) follows from its hint, its range, the bucketing scheme and the name ``warm`` gave its hint. A
    range may narrow (a guard refines it), so a family is reused only while the ShapeEnv still holds the
    very ``ValueRanges`` object its range was read from (a refinement replaces that object;
    ``bound_sympy`` of a symbol depends on nothing else) and the name stands.
    """

    __slots__ = ("hint", "hints", "exprs", "buckets")

    def __init__(self, sizevars: Any) -> None:
        self.hint = _hint_fns(sizevars)
        self.hints: dict[Any, int] = {}
        # sympy expression -> (its symbols, the plan expression): a pure function of the expression and
        # the hints, which never change during the graph's lowering
        self.exprs: dict[Any, tuple[tuple[Any, ...], Expr]] = {}
        # (symbol, scheme) -> (the range object it was read under, the hint's warm name, value, label or None)
        self.buckets: dict[tuple[Any, families.Scheme], tuple[object, str | None, int, str | None]] = {}

    @staticmethod
    def range_source(shape_env: Any, sym: Any) -> object | None:
        """The ShapeEnv's own range object for ``sym`` (None where it keeps no such table)."""
        table = getattr(shape_env, "var_to_range", None)
        return table.get(sym) if isinstance(table, dict) else None


_facts_by_graph: "weakref.WeakKeyDictionary[Any, _SymbolFacts]" = weakref.WeakKeyDictionary()


def _symbol_facts(sizevars: Any) -> _SymbolFacts:
    """The facts already read of ``sizevars``' symbols (dropped with it)."""
    try:
        facts = _facts_by_graph.get(sizevars)
    except TypeError:  # not weakly referenceable: facts of its own
        return _SymbolFacts(sizevars)
    return facts if facts is not None else state.kept(_facts_by_graph, sizevars, _SymbolFacts(sizevars))


class _Converter:
    """Turns IR sizes into expressions over axes named after their symbols.

    Each symbol's value is the upper bound of its hint's shape family
    (``prescreen.families``), so the plan, and the key, is the same for every
    hint in the bucket and the estimate never undercounts one of them. An
    expression the estimator cannot read, or one not known to grow with its
    symbols (``_grows``), is taken at the hint itself (its plan keys by the hint).
    """

    def __init__(self, sizevars: Any, scheme: families.Scheme | None = None) -> None:
        self.sizevars = sizevars
        self.facts = _symbol_facts(sizevars)
        self.hint = self.facts.hint
        self.shape_env = getattr(sizevars, "shape_env", None)
        self.scheme = families.active_scheme() if scheme is None else scheme
        self.statics: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.symbol_uses = 0  # symbols met by ``expr`` so far: unchanged over a tensor means it is static

    def _family(self, sym: Any) -> int:
        """``sym``'s value in plans (its bucket's bound, or its hint), its label recorded."""
        facts = self.facts
        source = facts.range_source(self.shape_env, sym)
        found = facts.buckets.get((sym, self.scheme))
        if (found is None or source is None or found[0] is not source
                or families.name_for(facts.hints[sym]) != found[1]):
            found = self._read_family(sym, source)
        if found[3] is not None:
            self.labels[sym.name] = found[3]
        return found[2]

    def _read_family(self, sym: Any, source: object | None) -> tuple[object, str | None, int, str | None]:
        facts = self.facts
        hint = facts.hints.get(sym)
        if hint is None:
            hint = facts.hints[sym] = self.hint(sym)
        bucket = families.bucket_for(hint, self.scheme, *families.symbol_range(self.shape_env, sym))
        named = families.name_for(hint)
        found: tuple[object, str | None, int, str | None] = (source, named, hint, None)
        if hint in bucket and not (bucket.exact and self.scheme.kind == "exact"):
            found = (source, named, bucket.high, bucket.describe(named or _source_name(self.shape_env, sym) or sym.name))
        if source is not None:
            facts.buckets[(sym, self.scheme)] = found
        return found

    def expr(self, e: Any) -> Expr:
        if isinstance(e, int):
            return Const(int(e))
        e = sympy.sympify(e)
        found = self.facts.exprs.get(e)
        if found is None:
            found = self.facts.exprs[e] = (tuple(e.free_symbols), self._convert(e))
        self.symbol_uses += len(found[0])
        for sym in found[0]:
            if sym.name not in self.statics:
                self.statics[sym.name] = self._family(sym)
        return found[1]

    def _convert(self, e: Any) -> Expr:
        try:
            converted = expr_from_sympy(e)
        except NotBounded:
            return Const(self.hint(e))  # the benchmark uses the concrete hint anyway
        return converted if _grows(e) else Const(self.hint(e))

    def tensor(self, name: str, node: Any, layout: Any) -> list[TensorArg | WorkspaceArg]:
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
            TensorArg(
                name=name,
                source="buffer",
                size=tuple(self.expr(s) for s in size),
                stride=tuple(self.expr(s) for s in _strides_of(node)),
                dtype=dtype,
                device=device,
            )
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


#: (device type, index) -> its flush buffer's bytes: a device's L2 size never changes
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


def _channels_last(conv: "_Converter", node: Any) -> bool:
    """Channel dim (1) has stride 1 with more than one channel: NHWC / NDHWC / NLC."""
    try:
        size, stride = list(node.get_size()), list(_strides_of(node))
        return len(size) >= 3 and conv.hint(stride[1]) == 1 and conv.hint(size[1]) > 1
    except Exception:
        return False


def extern_workspace_copies(name: str, device: Any, conv: "_Converter | None" = None, node: Any = None) -> int:
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
    return _benchmark_plan(conv, args, layout.device, f"select:{name}")


def _benchmark_plan(conv: _Converter, args: list[TensorArg | WorkspaceArg], device: Any, kernel_name: str) -> KernelPlan:
    """A plan of ``args`` plus the GPU benchmarker's flush buffer and slack, over ``conv``'s axes."""
    flush = flush_buffer_bytes(device)
    if flush:
        dev = str(device)
        args.append(WorkspaceArg("benchmark.cache_flush", Const(flush), "torch.uint8", dev, "NONE"))
        args.append(WorkspaceArg("benchmark.slack", Const(GPU_SLACK_BYTES), "torch.uint8", dev, "NONE"))
    axes = tuple(sorted(conv.statics))
    return KernelPlan(
        group_features=(),
        axis_names=axes,
        axis_static_values=tuple((a, conv.statics[a]) for a in axes),
        args=tuple(args),
        kernel_name=kernel_name,
        axis_labels=tuple((a, conv.labels[a]) for a in axes if a in conv.labels),
    )


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
    budget = state.budget_for(layout.device)
    outcome = lookup_or_decide(plan, budget, state.get_store())
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
    state.log_once(
        outcome.key,
        logging.WARNING,
        "prescreen: skipping autotune benchmark for %s (%d choices), using %s: %s [key %s, %s]",
        name,
        len(choices),
        getattr(fallback, "name", type(fallback).__name__),
        decision.reason,
        outcome.key[:12],
        "store hit" if outcome.hit else "computed",
    )
    return [fallback]


_CALL_PARAMS = ("self", "name", "choices", "input_nodes", "layout")
_AUTOTUNE_PARAMS = ("self", "name", "input_nodes", "layout", "input_gen_fns", "choices")
_FUSION_PARAMS = ("self", "node1", "node2")
_LOOKUP_PARAMS = ("self", "choices", "op", "inputs", "benchmark")


def _params_ok(fn: Callable[..., Any], expected: tuple[str, ...]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return tuple(params[: len(expected)]) == expected


def _signature_ok(fn: Callable[..., Any]) -> bool:
    """``__call__(self, name, choices, input_nodes, layout, ...)``, as in torch 2.11 to 2.14."""
    return _params_ok(fn, _CALL_PARAMS)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded_call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["choices"] = _guard(
                bound.arguments["self"], bound.arguments["name"], list(bound.arguments["choices"]), bound.arguments["input_nodes"],
                bound.arguments["layout"],
            )
            args, kwargs = bound.args, bound.kwargs
        except Exception as exc:  # never break a compile
            state.log_once(f"select-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: select-algorithm guard failed (%r); autotuning as upstream would", exc)
        return original(*args, **kwargs)

    setattr(guarded_call, _ORIGINAL_ATTR, original)
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

    setattr(guarded_autotune, _ORIGINAL_ATTR, original)
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

    setattr(guarded_lookup, _ORIGINAL_ATTR, original)
    return guarded_lookup


# ---------------------------------------------------------------- epilogue fusion


def _is_benchmarked_fusion(node1: Any, node2: Any) -> bool:
    """Whether upstream benchmarks this fusion (a multi-template node, or ``benchmark_fusion``)."""
    from torch._inductor import config, ir

    if getattr(config, "benchmark_fusion", False):
        return True
    return any(
        n.is_template() and isinstance(n.get_template_node(), ir.MultiTemplateBuffer) for n in (node1, node2)
    )


def _dep_names(node: Any) -> tuple[set[str], set[str]]:
    """Names of the buffers ``node`` reads and writes (weak ordering edges left out)."""
    rw = node.read_writes
    reads = {d.name for d in rw.reads if type(d).__name__ != "WeakDep"}
    writes = {d.name for d in rw.writes if type(d).__name__ != "WeakDep"}
    return reads, writes


def _kernel_args(scheduler: Any, nodes: Sequence[Any]) -> tuple[list[str], set[str], set[str]]:
    """The buffers one benchmarked kernel of ``nodes`` takes, those it mutates, and those it may write in place.

    As Inductor's codegen does: reads produced inside the kernel are not
    arguments, and a write every user of which is inside the kernel is removed
    (``Scheduler.can_buffer_be_removed_through_fusion``; kept where that method
    is missing). A buffer one node both reads and writes is mutated in place.

    In place: a pointwise/reduction kernel may write an output into the buffer
    of an intermediate input whose every user is in the kernel, of the same size
    and dtype (``in_out_ptr``); the argument is then mutated, so
    ``benchmark_codegened_module`` clones it for its first call and runtime
    autotuning may clone it again. Which pair codegen picks is decided later, so
    every output that has such an input is counted.
    """
    from torch._inductor.virtualized import V

    names = {n.get_name() for node in nodes for n in node.get_nodes()}
    removable = getattr(scheduler, "can_buffer_be_removed_through_fusion", None)

    def local(name: str) -> bool:
        return removable is not None and bool(removable(name, names))

    reads: set[str] = set()
    writes: set[str] = set()
    mutated: set[str] = set()
    for node in nodes:
        r, w = _dep_names(node)
        reads |= r
        writes |= w
        mutated |= r & w
    kept = {w for w in writes if w in mutated or not local(w)}
    args = sorted((reads - writes) | kept | mutated)
    if any(n.is_template() for n in nodes):
        return args, mutated, set()

    def shape(name: str) -> tuple[Any, ...] | None:
        try:
            buf = V.graph.get_buffer(name)
            return (tuple(buf.get_size()), buf.get_dtype())
        except Exception:
            return None

    graph_inputs = set(getattr(V.graph, "graph_inputs", {}))
    reusable = {shape(r) for r in args
                if r not in writes and r not in graph_inputs and r not in mutated and (removable is None or local(r))}
    reusable.discard(None)
    inplace = {w for w in (kept - mutated) if shape(w) in reusable}
    return args, mutated, inplace


def _fusion_kernels(node1: Any, node2: Any) -> list[tuple[str, list[Any]]]:
    """The kernels ``speedup_by_fusion`` may benchmark: each non-template node alone, and the fusion.

    A template node alone is the algorithm selection, benchmarked (and guarded)
    by ``choice_timings``; the others go through ``benchmark_fused_nodes`` and the
    fused kernel through ``benchmark_codegened_module``, one after another, each
    on its own synthesized arguments.
    """
    alone = [(f"fusion:unfused{i}", [n]) for i, n in enumerate((node1, node2), 1) if not n.is_template()]
    return [*alone, ("fusion:fused", [node1, node2])]


def concrete_tensor_arg(label: str, tensor: Any) -> TensorArg:
    """A plan argument for a real tensor: its own sizes, strides, dtype and device."""
    return TensorArg(name=label, source="buffer", size=tuple(Const(int(d)) for d in tensor.size()),
                     stride=tuple(Const(int(s)) for s in tensor.stride()), dtype=str(tensor.dtype),
                     device=str(tensor.device))


def _graph_tensor(conv: "_Converter", label: str, name: str) -> list[TensorArg | WorkspaceArg]:
    """One kernel argument: a graph buffer at its symbolic size, or a constant at its real size."""
    from torch._inductor.virtualized import V

    graph = V.graph
    constant = getattr(graph, "constants", {}).get(name)
    if constant is not None:
        return [concrete_tensor_arg(label, constant)]
    lookup = getattr(graph, "try_get_buffer", None) or graph.get_buffer
    buf = lookup(name)
    if buf is None:
        raise LookupError(f"buffer {name!r} of a benchmarked fusion is not in the graph")
    return conv.tensor(label, buf, buf.get_layout())


def _relabeled(tensor: Sequence[TensorArg | WorkspaceArg], label: str) -> list[TensorArg | WorkspaceArg]:
    """A clone of one ``_graph_tensor`` under ``label``: the same sizes, strides and offset (converted once)."""
    prefix = len(tensor[0].name)
    return [dataclasses.replace(arg, name=label + arg.name[prefix:]) for arg in tensor]


#: scheduler -> (kernel name, its argument buffers, mutated, in place, device) -> the plan built for them
_fusion_plans: "weakref.WeakKeyDictionary[Any, dict[tuple[object, ...], KernelPlan]]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True, slots=True)
class _Converted:
    """One buffer's arguments as a converter of its own made them, and what that converter recorded: the
    shape family of each symbol met (``statics``), their labels, and how many symbols it met."""

    args: tuple[TensorArg | WorkspaceArg, ...]
    statics: dict[str, int]
    labels: dict[str, str]
    symbol_uses: int


#: scheduler -> (buffer name, bucketing scheme) -> the buffer converted (see ``_shared_or_converted``)
_converted: "weakref.WeakKeyDictionary[Any, dict[tuple[str, object], _Converted]]" = weakref.WeakKeyDictionary()


def _shared_or_converted(
    conv: _Converter, shared: dict[tuple[str, object], _Converted], label: str, name: str
) -> list[TensorArg | WorkspaceArg]:
    """``_graph_tensor(conv, label, name)``, converted once per scheduler (a buffer's layout is fixed by then)
    and reused by the plans of every kernel that takes it.

    A converter's result for a buffer depends on the buffer and the bucketing scheme alone (each symbol's
    family is read off the graph's facts), so the buffer is converted by a converter of its own, and the
    symbols it met are recorded in ``conv`` as if ``conv`` had converted it: they are that plan's axes.
    """
    found = shared.get((name, conv.scheme))
    if found is None:
        own = _Converter(conv.sizevars, conv.scheme)
        tensor = _graph_tensor(own, label, name)
        found = shared[(name, conv.scheme)] = _Converted(tuple(tensor), own.statics, own.labels, own.symbol_uses)
    else:
        tensor = _relabeled(found.args, label)
    conv.statics.update(found.statics)
    conv.labels.update(found.labels)
    conv.symbol_uses += found.symbol_uses
    return tensor


def plans_for_fusion(scheduler: Any, node1: Any, node2: Any) -> list[KernelPlan]:
    """One plan per kernel the epilogue-fusion step may benchmark (see ``_fusion_kernels``).

    Each holds that kernel's arguments at their size hints (``get_args``
    synthesizes every one), the flush buffer, and for each argument the kernel
    mutates (or may write in place, ``_kernel_args``) two clones: the one
    ``benchmark_codegened_module`` passes to its first call, and the one runtime
    autotuning of that call may make. The kernels are benchmarked one at a time,
    so the step's footprint is the largest of these plans, not their union; the
    step tunes only if every plan does.

    A scheduler's fusion rounds may ask about the same kernel again: a plan is
    built once per scheduler for the same argument buffers (their layouts are
    fixed by then), and the same plan object is then answered from its memory
    by the lookup.
    """
    from torch._inductor.virtualized import V

    built: dict[tuple[object, ...], KernelPlan] = state.kept(_fusion_plans, scheduler, {})
    shared: dict[tuple[str, object], _Converted] = state.kept(_converted, scheduler, {})
    device = _fusion_device(node1)
    plans: list[KernelPlan] = []
    for kernel_name, nodes in _fusion_kernels(node1, node2):
        names, mutated, inplace = _kernel_args(scheduler, nodes)
        known = (kernel_name, tuple(names), frozenset(mutated), frozenset(inplace), str(device))
        plan = built.get(known)
        if plan is None:
            conv = _Converter(V.graph.sizevars)
            args: list[TensorArg | WorkspaceArg] = []
            for i, name in enumerate(names):
                tensor = _shared_or_converted(conv, shared, f"buf{i}", name)
                args.extend(tensor)
                if name in mutated:
                    args.extend(_relabeled(tensor, f"buf{i}.clone"))
                if name in mutated or name in inplace:
                    args.extend(_relabeled(tensor, f"buf{i}.autotune_clone"))
            plan = built[known] = _benchmark_plan(conv, args, device, kernel_name)
        plans.append(plan)
    return plans


def _fusion_device(node1: Any) -> Any:
    try:
        return node1.get_device()
    except Exception:
        return None


def _no_fusion() -> Any:
    """Upstream's "do not fuse" answer: ``FusionResult.fuse(False)`` where it exists, else False."""
    from torch._inductor import scheduler

    result_cls = getattr(scheduler, "FusionResult", None)
    return result_cls.fuse(False) if result_cls is not None and hasattr(result_cls, "fuse") else False


def _wrap_fusion(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.speedup_by_fusion`` guarded: over budget, or on an OOM, the template and its
    epilogue stay separate kernels (upstream's answer when fusing is not faster), unbenchmarked."""

    @functools.wraps(original)
    def guarded_fusion(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        device = None
        plans: list[KernelPlan] = []
        try:
            if _is_benchmarked_fusion(node1, node2):
                device = _fusion_device(node1)
                plans = plans_for_fusion(self, node1, node2)
                budget, store = state.budget_for(device), state.get_store()
                for plan in plans:
                    outcome = lookup_or_decide(plan, budget, store)
                    if not outcome.decision.tune:
                        state.log_once(outcome.key, logging.WARNING,
                                       "prescreen: skipping the epilogue-fusion benchmark, kernels left unfused: "
                                       "%s: %s [key %s, %s]", plan.kernel_name, outcome.decision.reason,
                                       outcome.key[:12], "store hit" if outcome.hit else "computed")
                        return _no_fusion()
                if state.plan_only():
                    return _no_fusion()  # decided and recorded; nothing is benchmarked
        except Exception as exc:  # never break a compile
            state.log_once(f"fusion-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: epilogue-fusion guard failed (%r); benchmarking as upstream would", exc)
            device = None
        if device is None:
            return original(self, node1, node2, *args, **kwargs)
        try:
            return original(self, node1, node2, *args, **kwargs)
        except Exception as exc:
            if not oom.is_oom(exc):
                raise
            info = oom.info(exc, device)
        oom.release(device)
        # which kernel ran out is not known: every one falls back next time
        oom.record(lambda: plans, device, info, "the epilogue-fusion benchmark", "the unfused kernels")
        return _no_fusion()

    setattr(guarded_fusion, _ORIGINAL_ATTR, original)
    return guarded_fusion


# ---------------------------------------------------------------- install


def _patch_attr(cls: Any, attr: str, expected: tuple[str, ...], wrap: Callable[..., Any], what: str) -> bool:
    import torch

    current = getattr(cls, attr, None)
    if current is None:
        log.warning("prescreen: torch %s has no %s.%s; the %s guard is not installed",
                    torch.__version__, cls.__name__, attr, what)
        return False
    if hasattr(current, _ORIGINAL_ATTR):
        return True
    if not _params_ok(current, expected):
        log.warning("prescreen: %s.%s in torch %s does not take (%s); the %s guard is not installed",
                    cls.__name__, attr, torch.__version__, ", ".join(expected[1:]), what)
        return False
    setattr(cls, attr, wrap(current))
    return True


def _unpatch_attr(cls: Any, attr: str) -> None:
    original = getattr(getattr(cls, attr, None), _ORIGINAL_ATTR, None)
    if original is not None:
        setattr(cls, attr, original)


def patch() -> bool:
    """Install the guards on Inductor's algorithm selection; True if the selection guard is installed.

    ``AlgorithmSelectorCache.__call__`` (the decision), ``.autotune`` (the OOM
    retry), ``Scheduler.speedup_by_fusion`` (the epilogue-fusion benchmark)
    and ``CachingAutotuner.benchmark_all_configs`` (Triton's runtime
    autotuning, see ``prescreen.hooks.triton_autotune``). An Inductor whose
    method has another signature is left alone, with a warning naming the
    torch version, rather than guessed at.
    """
    from torch._inductor import scheduler
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    from prescreen.hooks import triton_autotune

    ok = _patch_attr(AlgorithmSelectorCache, "__call__", _CALL_PARAMS, _wrap, "select-algorithm")
    if ok:
        _patch_attr(AlgorithmSelectorCache, "autotune", _AUTOTUNE_PARAMS, _wrap_autotune, "autotune OOM-retry")
        _patch_attr(AlgorithmSelectorCache, "lookup", _LOOKUP_PARAMS, _wrap_lookup, "autotune-cache")
        _patch_attr(scheduler.Scheduler, "speedup_by_fusion", _FUSION_PARAMS, _wrap_fusion, "epilogue-fusion")
    triton_autotune.patch()
    return ok


def unpatch() -> None:
    """Restore upstream's methods."""
    import sys

    module = sys.modules.get("torch._inductor.select_algorithm")
    if module is not None:
        _unpatch_attr(module.AlgorithmSelectorCache, "__call__")
        _unpatch_attr(module.AlgorithmSelectorCache, "autotune")
        _unpatch_attr(module.AlgorithmSelectorCache, "lookup")
    sched = sys.modules.get("torch._inductor.scheduler")
    if sched is not None:
        _unpatch_attr(sched.Scheduler, "speedup_by_fusion")
    from prescreen.hooks import triton_autotune

    triton_autotune.unpatch()

"""Guard Inductor's max-autotune algorithm selection (CPU and CUDA).

``AlgorithmSelectorCache.__call__`` benchmarks every choice on example inputs
it synthesizes from the size hints of the symbolic input and output layouts
(``benchmark_example_value`` -> ``rand_strided``). The guard estimates those
bytes with the same estimator, budget and store; over budget it hands the
selector only the ATen extern choice, which it returns without benchmarking.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from prescreen.errors import NotBounded
from prescreen.expr import Const, Expr, expr_from_sympy
from prescreen.hooks import state
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

        return get_strides_with_layout_constraints(node)
    except (ImportError, AttributeError, TypeError):
        return node.get_stride()


class _Converter:
    """Turns IR sizes into expressions over axes named after their symbols."""

    def __init__(self, sizevars: Any) -> None:
        self.hint = _hint_fns(sizevars)
        self.statics: dict[str, int] = {}

    def expr(self, e: Any) -> Expr:
        if isinstance(e, int):
            return Const(int(e))
        e = sympy.sympify(e)
        for sym in e.free_symbols:
            if sym.name not in self.statics:
                self.statics[sym.name] = self.hint(sym)
        try:
            return expr_from_sympy(e)
        except NotBounded:
            return Const(self.hint(e))  # the benchmark uses the concrete hint anyway

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


def flush_buffer_bytes(device: Any) -> int:
    """Bytes the GPU benchmarker allocates to flush the L2 cache between timings (0 on CPU).

    Inductor's GPU benchmarker flushes with an L2-sized buffer on CUDA (measured
    on an H200 with torch 2.11: exactly the 60 MiB L2) and with Triton's 256 MiB
    one on ROCm; an unknown L2 size counts as 256 MiB.
    """
    if getattr(device, "type", "cpu") in ("cpu", "meta"):
        return 0
    try:
        import torch

        if torch.version.hip:
            return TRITON_FLUSH_BYTES
        backend = getattr(torch, device.type)
        l2 = int(getattr(backend.get_device_properties(device), "L2_cache_size", 0) or 0)
    except Exception:
        l2 = 0
    return l2 or TRITON_FLUSH_BYTES


def plan_for_selection(name: str, input_nodes: Sequence[Any], layout: Any) -> KernelPlan:
    """The benchmark plan of one algorithm selection: unique inputs plus the output."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    conv = _Converter(V.graph.sizevars)
    args: list[TensorArg | WorkspaceArg] = []
    seen: set[str] = set()
    for i, node in enumerate(input_nodes):
        node_name = node.get_name()
        if node_name in seen:
            continue
        seen.add(node_name)
        base = node.unwrap_view() if isinstance(node, ir.BaseView) else node
        args.extend(conv.tensor(f"input{i}", base, base.get_layout()))
    out = ir.Buffer(name="prescreen_out", layout=layout)
    args.extend(conv.tensor("output", out, layout))
    flush = flush_buffer_bytes(layout.device)
    if flush:
        dev = str(layout.device)
        args.append(WorkspaceArg("benchmark.cache_flush", Const(flush), "torch.uint8", dev, "NONE"))
        args.append(WorkspaceArg("benchmark.slack", Const(GPU_SLACK_BYTES), "torch.uint8", dev, "NONE"))
    axes = tuple(sorted(conv.statics))
    return KernelPlan(
        group_features=(),
        axis_names=axes,
        axis_static_values=tuple((a, conv.statics[a]) for a in axes),
        args=tuple(args),
        kernel_name=f"select:{name}",
    )


def _fallback_choice(choices: Sequence[Any]) -> Any | None:
    from torch._inductor.select_algorithm import ExternKernelCaller

    for choice in choices:
        if isinstance(choice, ExternKernelCaller):
            return choice
    return None


def _guard(name: str, choices: list[Any], input_nodes: Sequence[Any], layout: Any) -> list[Any]:
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
    if decision.tune:
        return choices
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


def _signature_ok(fn: Callable[..., Any]) -> bool:
    """``__call__(self, name, choices, input_nodes, layout, ...)``, as in torch 2.11 to 2.14."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return tuple(params[: len(_CALL_PARAMS)]) == _CALL_PARAMS


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded_call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["choices"] = _guard(
                bound.arguments["name"], list(bound.arguments["choices"]), bound.arguments["input_nodes"],
                bound.arguments["layout"],
            )
            args, kwargs = bound.args, bound.kwargs
        except Exception as exc:  # never break a compile
            state.log_once(f"select-error:{type(exc).__name__}", logging.WARNING,
                           "prescreen: select-algorithm guard failed (%r); autotuning as upstream would", exc)
        return original(*args, **kwargs)

    setattr(guarded_call, _ORIGINAL_ATTR, original)
    return guarded_call


def patch() -> bool:
    """Install the guard on ``AlgorithmSelectorCache.__call__``; True if installed.

    An Inductor whose ``__call__`` has another signature is left alone, with a
    warning naming the torch version, rather than guessed at.
    """
    import torch
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    current = AlgorithmSelectorCache.__call__
    if hasattr(current, _ORIGINAL_ATTR):
        return True
    if not _signature_ok(current):
        log.warning("prescreen: AlgorithmSelectorCache.__call__ in torch %s does not take (name, choices, "
                    "input_nodes, layout); the select-algorithm guard is not installed", torch.__version__)
        return False
    AlgorithmSelectorCache.__call__ = _wrap(current)  # type: ignore[method-assign]
    return True


def unpatch() -> None:
    """Restore upstream's ``AlgorithmSelectorCache.__call__``."""
    import sys

    module = sys.modules.get("torch._inductor.select_algorithm")
    if module is None:
        return
    cls = module.AlgorithmSelectorCache
    original = getattr(cls.__call__, _ORIGINAL_ATTR, None)
    if original is not None:
        cls.__call__ = original

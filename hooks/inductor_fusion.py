"""Guard Inductor's epilogue-fusion benchmark (``Scheduler.speedup_by_fusion``).

Where upstream benchmarks a fusion (a multi-template node, or ``benchmark_fusion``), the guard builds one plan
per candidate kernel off the scheduler nodes and decides each; over budget, or on an OOM, the kernels stay
unfused and unbenchmarked: upstream's own answer when fusing is not faster. An OOM counts in the call and in
the benchmark upstream defers until the kernels compile (``FusionResult.callable_fn``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from prescreen.hooks import oom, state
from prescreen.hooks.inductor_select import (
    ORIGINAL_ATTR,
    _Converter,
    benchmark_plan,
    concrete_tensor_arg,
    patch_attr,
    unpatch_attr,
)
from prescreen.plan import KernelPlan, TensorArg, WorkspaceArg
from prescreen.service import lookup_or_decide_all

__all__ = ["map_deferred", "patch", "plans_for_fusion", "unpatch"]

_FUSION_PARAMS = ("self", "node1", "node2")


def _is_benchmarked_fusion(node1: Any, node2: Any) -> bool:
    """Whether upstream benchmarks this fusion (a multi-template node, or ``benchmark_fusion``)."""
    from torch._inductor import config, ir

    if getattr(config, "benchmark_fusion", False):
        return True
    return any(
        n.is_template() and isinstance(n.get_template_node(), ir.MultiTemplateBuffer) for n in (node1, node2)
    )


def _kernel_args(scheduler: Any, nodes: Sequence[Any]) -> tuple[list[str], set[str], set[str]]:
    """The buffers one benchmarked kernel of ``nodes`` takes, those it mutates, and those it may write in place.

    As codegen does: reads produced inside the kernel are not arguments, a write all of whose users are inside
    is removed (``can_buffer_be_removed_through_fusion``, where it exists), and a buffer read and written is
    mutated. In place: a pointwise/reduction kernel may write an output into an intermediate input of the same
    size and dtype used only inside (``in_out_ptr``), which is then cloned like a mutated one; codegen picks the
    pair later, so every output that has such an input is counted.
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
        rw = node.read_writes  # weak ordering edges are not arguments
        r = {d.name for d in rw.reads if type(d).__name__ != "WeakDep"}
        w = {d.name for d in rw.writes if type(d).__name__ != "WeakDep"}
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
    """The kernels ``speedup_by_fusion`` may benchmark, one after another: each non-template node alone, and the
    fusion (a template alone is the algorithm selection, guarded there)."""
    alone = [(f"fusion:unfused{i}", [n]) for i, n in enumerate((node1, node2), 1) if not n.is_template()]
    return [*alone, ("fusion:fused", [node1, node2])]


def _graph_tensor(conv: _Converter, label: str, name: str) -> list[TensorArg | WorkspaceArg]:
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


def plans_for_fusion(scheduler: Any, node1: Any, node2: Any) -> list[KernelPlan]:
    """One plan per kernel the epilogue-fusion step may benchmark (``_fusion_kernels``): its arguments at their
    size hints, the flush buffer, and two clones of each argument it mutates or may write in place (the first
    call's and runtime autotuning's). The kernels run one at a time: the step tunes only if every plan does."""
    from torch._inductor.virtualized import V

    device = _fusion_device(node1)
    conv = _Converter(V.graph.sizevars)
    plans: list[KernelPlan] = []
    for kernel_name, nodes in _fusion_kernels(node1, node2):
        names, mutated, inplace = _kernel_args(scheduler, nodes)
        args: list[TensorArg | WorkspaceArg] = []
        for i, name in enumerate(names):
            args.extend(_graph_tensor(conv, f"buf{i}", name))
            if name in mutated:
                args.extend(_graph_tensor(conv, f"buf{i}.clone", name))
            if name in mutated or name in inplace:
                args.extend(_graph_tensor(conv, f"buf{i}.autotune_clone", name))
        plans.append(benchmark_plan(conv, args, device, kernel_name))
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


def map_deferred(result: Any, wrap: Callable[[Callable[[], bool]], Callable[[], bool]]) -> Any:
    """``speedup_by_fusion``'s ``result`` with ``wrap`` around the benchmark it defers: the kernels compile in the
    background and upstream benchmarks them once they are ready, outside the call (``FusionResult.callable_fn``,
    run by ``_finish_pending_fusions``). Unchanged where nothing is deferred."""
    deferred = getattr(result, "callable_fn", None)
    if deferred is None or not hasattr(result, "__dataclass_fields__"):
        return result
    return dataclasses.replace(result, callable_fn=wrap(deferred))


def _wrap_fusion(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.speedup_by_fusion`` guarded: over budget, or on an OOM (in the call or in the benchmark it
    defers), the template and its epilogue stay separate kernels (upstream's answer when fusing is not faster)."""

    @functools.wraps(original)
    def guarded_fusion(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> Any:
        device = None
        plans: list[KernelPlan] = []
        try:
            if _is_benchmarked_fusion(node1, node2):
                device = _fusion_device(node1)
                plans = plans_for_fusion(self, node1, node2)
                for plan, outcome in zip(plans, lookup_or_decide_all(plans, state.budget_for(device),
                                                                     state.get_store())):
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

        def retried(run: Callable[[], Any], unfused: Callable[[], Any]) -> Any:
            # which kernel ran out is not known: every one falls back next time
            return oom.retry(run, unfused, device, lambda: plans, "the epilogue-fusion benchmark",
                             "the unfused kernels")

        result = retried(lambda: original(self, node1, node2, *args, **kwargs), _no_fusion)
        # the deferred benchmark gets the same retry, "not faster" its fallback
        return map_deferred(result, lambda deferred: lambda: retried(deferred, lambda: False))

    setattr(guarded_fusion, ORIGINAL_ATTR, original)
    return guarded_fusion


def patch() -> bool:
    """Install the guard on ``Scheduler.speedup_by_fusion`` (left alone, with a warning, if its signature differs)."""
    from torch._inductor import scheduler

    return patch_attr(scheduler.Scheduler, "speedup_by_fusion", _FUSION_PARAMS, _wrap_fusion, "epilogue-fusion")


def unpatch() -> None:
    """Restore upstream's ``speedup_by_fusion``."""
    import sys

    sched = sys.modules.get("torch._inductor.scheduler")
    if sched is not None:
        unpatch_attr(sched.Scheduler, "speedup_by_fusion")

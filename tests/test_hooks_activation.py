"""install / uninstall / installed / PRESCREEN=1 / backend="prescreen", and never breaking a compile."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import torch
from torch._inductor.select_algorithm import AlgorithmSelectorCache

import prescreen
from prescreen.hooks import activation, select_algorithm, state

CHECK = (
    "import torch, torch._inductor.select_algorithm as sa;"
    "print('PATCHED' if hasattr(sa.AlgorithmSelectorCache.__call__, '_prescreen_original_call') else 'PLAIN')"
)


def _patched() -> bool:
    return hasattr(AlgorithmSelectorCache.__call__, "_prescreen_original_call")


def test_install_is_idempotent_and_uninstall_restores_upstream() -> None:
    original = AlgorithmSelectorCache.__call__
    assert not _patched()
    prescreen.install()
    prescreen.install()
    assert _patched()
    assert AlgorithmSelectorCache.__call__._prescreen_original_call is original
    prescreen.uninstall()
    prescreen.uninstall()
    assert AlgorithmSelectorCache.__call__ is original


def test_context_manager_leaves_state_as_found() -> None:
    with prescreen.installed():
        assert _patched()
    assert not _patched()
    prescreen.install()
    with prescreen.installed():
        assert _patched()
    assert _patched()
    prescreen.uninstall()


def test_concurrent_install_patches_once() -> None:
    original = AlgorithmSelectorCache.__call__
    threads = [threading.Thread(target=prescreen.install) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert AlgorithmSelectorCache.__call__._prescreen_original_call is original
    prescreen.uninstall()
    assert AlgorithmSelectorCache.__call__ is original


def _python(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "PRESCREEN"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=300).stdout.strip()


def test_prescreen_env_var_installs_on_import_torch() -> None:
    assert _python(CHECK, PRESCREEN="1").endswith("PATCHED")
    assert _python(CHECK).endswith("PLAIN")


def test_backend_is_registered_and_compiles() -> None:
    assert "prescreen" in torch._dynamo.list_backends()
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="prescreen", dynamic=True)
    x = torch.randn(7)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)
    assert activation.is_installed()
    prescreen.uninstall()


def test_guard_error_hands_upstream_every_choice(monkeypatch) -> None:
    seen: list[list[str]] = []

    def upstream(self, name, choices, input_nodes, layout, *a, **k):
        seen.append(choices)
        return "node", choices[0]

    def boom(*_a, **_k):
        raise RuntimeError("estimator exploded")

    monkeypatch.setattr(select_algorithm, "_guard", boom)
    guarded = select_algorithm._wrap(upstream)
    assert guarded(object(), "mm", ["a", "b", "c"], [], None) == ("node", "a")
    assert seen == [["a", "b", "c"]]


def test_guard_sees_keyword_arguments_and_changes_only_choices(monkeypatch) -> None:
    calls: list[tuple] = []

    def upstream(self, name, choices, input_nodes, layout, input_gen_fns=None, *, extra=1):
        calls.append((name, choices, input_nodes, layout, input_gen_fns, extra))
        return "node", choices[0]

    monkeypatch.setattr(select_algorithm, "_guard", lambda name, choices, nodes, layout: choices[-1:])
    guarded = select_algorithm._wrap(upstream)
    guarded(object(), name="mm", choices=["a", "b"], input_nodes=[1], layout="L", input_gen_fns={0: 1}, extra=2)
    guarded(object(), "mm", ["a", "b"], [1], "L")
    assert calls == [("mm", ["b"], [1], "L", {0: 1}, 2), ("mm", ["b"], [1], "L", None, 1)]


def test_unrecognised_selector_signature_is_not_patched(monkeypatch, caplog) -> None:
    def other(self, choices, name, layout):  # a hypothetical future Inductor
        return None

    monkeypatch.setattr(AlgorithmSelectorCache, "__call__", other)
    assert select_algorithm.patch() is False
    assert AlgorithmSelectorCache.__call__ is other
    assert "does not take (name, choices, input_nodes, layout)" in caplog.text


def test_broken_store_still_decides(monkeypatch) -> None:
    import prescreen.store as store_mod

    def unopenable(**_k):
        raise OSError("disk on fire")

    state.reset()
    monkeypatch.setattr(store_mod, "open_store", unopenable)
    assert state.get_store() is None
    state.reset()

"""install / uninstall / installed / PRESCREEN=1 / backend="prescreen", and never breaking a compile."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading

import pytest
import torch
from torch._inductor.select_algorithm import AlgorithmSelectorCache

import prescreen
from prescreen.hooks import activation, inductor_select, state

CHECK = (
    "import torch, torch._inductor.select_algorithm as sa;"
    "print('PATCHED' if hasattr(sa.AlgorithmSelectorCache.__call__, '_prescreen_original_call') else 'PLAIN')"
)


def _patched() -> bool:
    return hasattr(AlgorithmSelectorCache.__call__, "_prescreen_original_call")


def test_install_is_idempotent_and_uninstall_restores_upstream() -> None:
    from torch._inductor.autotune_process import TuningProcess

    original, answer = AlgorithmSelectorCache.__call__, TuningProcess.get
    assert not _patched()
    prescreen.install()
    prescreen.install()
    assert _patched()
    assert AlgorithmSelectorCache.__call__._prescreen_original_call is original
    assert TuningProcess.get._prescreen_original_call is answer  # type: ignore[attr-defined]
    prescreen.uninstall()
    prescreen.uninstall()
    assert AlgorithmSelectorCache.__call__ is original and TuningProcess.get is answer


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

    monkeypatch.setattr(inductor_select, "_guard", boom)
    guarded = inductor_select._wrap(upstream)
    assert guarded(object(), "mm", ["a", "b", "c"], [], None) == ("node", "a")
    assert seen == [["a", "b", "c"]]


def test_guard_sees_keyword_arguments_and_changes_only_choices(monkeypatch) -> None:
    calls: list[tuple] = []

    def upstream(self, name, choices, input_nodes, layout, input_gen_fns=None, *, extra=1):
        calls.append((name, choices, input_nodes, layout, input_gen_fns, extra))
        return "node", choices[0]

    monkeypatch.setattr(inductor_select, "_guard", lambda selector, name, choices, nodes, layout: choices[-1:])
    guarded = inductor_select._wrap(upstream)
    guarded(object(), name="mm", choices=["a", "b"], input_nodes=[1], layout="L", input_gen_fns={0: 1}, extra=2)
    guarded(object(), "mm", ["a", "b"], [1], "L")
    assert calls == [("mm", ["b"], [1], "L", {0: 1}, 2), ("mm", ["b"], [1], "L", None, 1)]


def test_unrecognised_selector_signature_is_not_patched(monkeypatch, caplog) -> None:
    def other(self, choices, name, layout):  # a hypothetical future Inductor
        return None

    monkeypatch.setattr(AlgorithmSelectorCache, "__call__", other)
    assert inductor_select.patch() is False
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


@pytest.mark.parametrize(("mode", "options"), [
    ("max-autotune", None),
    ("max-autotune-no-cudagraphs", None),
    (None, {"max_autotune": True}),
    ("default", None),
])
def test_backend_accepts_what_inductor_accepts(mode, options) -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="prescreen", mode=mode, options=options)
    x = torch.randn(7)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)
    assert activation.is_installed()
    prescreen.uninstall()


def test_backend_applies_mode_and_options_like_inductor(monkeypatch) -> None:
    from torch._inductor import compile_fx

    from prescreen.hooks import backend

    seen = []
    real = compile_fx.compile_fx

    def spy(gm, inputs, **kwargs):
        seen.append(kwargs.get("config_patches"))
        return real(gm, inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx", spy)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="prescreen", options={"max_autotune": True, "freezing": True})
    fn(torch.randn(3))
    assert seen and seen[0]["max_autotune"] is True and seen[0]["freezing"] is True
    assert backend.autotuning_on(seen[0])
    prescreen.uninstall()


def test_backend_rejects_an_unknown_option_like_inductor() -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="prescreen", options={"no_such_option": 1})
    with pytest.raises(Exception, match="no_such_option"):
        fn(torch.randn(3))
    prescreen.uninstall()


def test_backend_says_once_that_nothing_is_guarded_without_max_autotune(caplog) -> None:
    from prescreen.hooks import state

    state.reset()
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="prescreen.hooks"):
        fn = torch.compile(lambda x: x * 3, backend="prescreen")
        fn(torch.randn(3))
        fn(torch.randn(3, 2))
    notes = [r for r in caplog.records if "guards nothing" in r.getMessage()]
    assert len(notes) == 1
    prescreen.uninstall()


def test_installed_restores_the_exact_previous_overrides(tmp_path) -> None:
    from prescreen.store import DiskStore

    state.reset()
    prescreen.install(ratio=0.5)
    before = state.snapshot()
    with prescreen.installed(device_memory=64 * 1024, ratio=0.1, store=DiskStore(tmp_path / "s")):
        assert state.overrides() == (0.1, 64 * 1024)
    assert state.snapshot() == before
    assert state.overrides() == (0.5, None)
    prescreen.uninstall()
    state.reset()
    with prescreen.installed(device_memory=64 * 1024):
        pass
    prescreen.install()
    assert state.overrides() == (None, None), "a 64 KiB device memory survived the with block"
    prescreen.uninstall()
    state.reset()


def test_install_logs_one_info_line_and_verbose_exit_summary(tmp_path) -> None:
    code = ("import logging, torch, prescreen; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
            "prescreen.install(); prescreen.install()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRESCREEN")}
    env.update(PRESCREEN_CACHE_DIR=str(tmp_path), PRESCREEN_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("prescreen: guards installed") == 1, proc.stderr
    assert re.search(r"prescreen: \d+ lookups, \d+ store hits, \d+ computed, \d+ fallbacks", proc.stderr), proc.stderr


def test_an_explicit_install_opens_the_store_and_a_lazy_one_waits_for_the_first_lookup(tmp_path, monkeypatch) -> None:
    """The store's opening (a directory check and a SQLite open) and the reading of the library versions every
    key holds are paid at install, not inside the first compile."""
    from prescreen.key import library_versions

    prescreen.uninstall()
    state.reset()
    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path / "explicit"))
    library_versions.cache_clear()
    prescreen.install()
    try:
        store = state.snapshot()[0]
        assert store is not None and store.location == str(tmp_path / "explicit")
        assert (tmp_path / "explicit" / "cache.db").is_file()
        assert library_versions.cache_info().currsize == 1
    finally:
        prescreen.uninstall()
        state.reset()
    monkeypatch.setenv("PRESCREEN_CACHE_DIR", str(tmp_path / "lazy"))
    library_versions.cache_clear()
    activation.install(lazy=True)
    try:
        assert state.snapshot()[0] is None and not (tmp_path / "lazy").exists()
        assert library_versions.cache_info().currsize == 0
        assert state.get_store() is not None and (tmp_path / "lazy" / "cache.db").is_file()
    finally:
        prescreen.uninstall()
        state.reset()


def test_aoti_per_kernel_autotune_arguments_are_on_while_installed_every_time() -> None:
    import torch._inductor.compile_fx  # noqa: F401 - the guards patch it when it is imported
    from torch._inductor import config as ic

    if not hasattr(ic.aot_inductor, "autotune_per_kernel_alloc"):
        pytest.skip("this torch has no aot_inductor.autotune_per_kernel_alloc")
    for _ in range(2):  # giving the setting back must not make it look like the user's own next time
        with prescreen.installed(device_memory="64GiB"):
            assert ic.aot_inductor.autotune_per_kernel_alloc is True
        assert ic.aot_inductor.autotune_per_kernel_alloc is False

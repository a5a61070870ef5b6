"""The Inductor guards' former module, re-exporting what callers outside ``prescreen.hooks`` still import.

The guards live in ``prescreen.hooks.inductor_select`` (algorithm selection) and
``prescreen.hooks.inductor_fusion`` (epilogue fusion); import from there.
"""

from prescreen.hooks.inductor_fusion import _is_benchmarked_fusion, plans_for_fusion
from prescreen.hooks.inductor_select import (
    GPU_SLACK_BYTES,
    _Converter,
    _grows,
    concrete_tensor_arg,
    flush_buffer_bytes,
    plan_for_selection,
)

__all__ = [
    "GPU_SLACK_BYTES", "_Converter", "_grows", "_is_benchmarked_fusion", "concrete_tensor_arg", "flush_buffer_bytes",
    "plan_for_selection", "plans_for_fusion",
]

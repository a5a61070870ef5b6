"""The one exception the estimator raises when a plan cannot be bounded."""

from __future__ import annotations

import enum


class Reason(str, enum.Enum):
    """Why a benchmark footprint cannot be bounded (a fail-closed cause)."""

    INVALID_PLAN = "invalid_plan"
    NEGATIVE_SIZE = "negative_size"
    NEGATIVE_STRIDE = "negative_stride"
    RANK_MISMATCH = "rank_mismatch"
    DIVISION_BY_ZERO = "division_by_zero"
    RUNTIME_DEPENDENT = "runtime_dependent"
    UNKNOWN_DTYPE = "unknown_dtype"
    UNKNOWN_EXPR = "unknown_expr"
    MISSING_AXIS = "missing_axis"
    UNSUPPORTED_GROUPING = "unsupported_grouping"
    OBSERVED_OOM = "observed_oom"  # not an estimator cause: a guarded benchmark really ran out of memory


class NotBounded(ValueError):
    """A plan whose benchmark footprint cannot be bounded: the caller must fall back."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class ConfigError(ValueError):
    """A bad configuration value (env var, CLI option); the message names it."""

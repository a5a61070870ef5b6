"""A stored decision: JSON text (schema 5's four lines, ``trust.canonical``), validated on the way back in.

A lookup checks every line but the plan (``dynamic`` is stored so it can check ``enable_auto_blockify``); an import,
a bundle or ``inspect --verify`` decodes the plan too, which must then match. A payload keeps the plan as a string.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Mapping

from prescreen.decision import Decision, is_observed_oom
from prescreen.key import SCHEMA_VERSION, KeyParts, plan_hashes
from prescreen.plan import KernelPlan, canonical_json
from prescreen.store.trust import (
    DECISION_FIELD,
    HEAD_FIELDS,
    PLAN_FIELD,
    SIGNATURE_FIELD,
    BadSignature,
    Signer,
    canonical,
)

MAX_ENTRY_BYTES = 4 * 2**20  # an entry's JSON text is a few KiB; anything above this cap is refused unread
MAX_DEPTH = 64  # nesting of a stored plan or family; a valid plan expression is a few levels deep
_HEAD_KEYS = HEAD_FIELDS | {SIGNATURE_FIELD}


class InvalidEntry(ValueError):
    """A stored value that is not a valid entry of this schema."""


class UnsignedEntry(InvalidEntry):
    """An entry without a valid signature while a signing key is configured (``trust``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One decision with its key, plan, shape family and provenance."""

    key: str
    parts: KeyParts
    kernel: str
    plan_text: str  # canonical JSON text of the plan payload, decoded on demand (``plan``)
    dynamic: bool
    family: dict[str, object] | None
    decision: Decision
    created_at: float
    host: str
    pid: int
    hits: int = 0
    schema_version: int = SCHEMA_VERSION

    @staticmethod
    def new(key: str, parts: KeyParts, plan: KernelPlan, family: dict[str, object] | None, decision: Decision) -> Entry:
        return Entry(key=key, parts=parts, kernel=plan.display_name, plan_text=canonical_json(plan.to_payload()),
                     dynamic=plan.is_dynamic, family=family, decision=decision, created_at=time.time(),
                     host=socket.gethostname(), pid=os.getpid())

    @property
    def plan(self) -> dict[str, object]:
        """The stored plan payload, decoded on each access; empty where it is not a JSON object within the depth
        cap (a lookup does not read the plan, so such an entry still serves hits; ``verify_entry`` says False)."""
        try:
            return _decode_plan(self.plan_text)
        except InvalidEntry:
            return {}

    def with_hits(self, hits: int) -> "Entry":
        return dataclasses.replace(self, hits=hits)

    def to_payload(self) -> dict[str, object]:
        payload = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        payload.update(plan=payload.pop("plan_text"), parts=self.parts.to_payload(), decision=self.decision.to_payload())
        return payload

    def signed_payload(self, signer: Signer | None) -> dict[str, object]:
        """``to_payload``, with a signature when ``signer`` is given."""
        payload = self.to_payload()
        if signer is not None:
            payload[SIGNATURE_FIELD] = signer.sign(payload)
        return payload

    def to_json(self, signer: Signer | None = None) -> str:
        """The stored text: canonical JSON, signed (the signature its last field) when ``signer`` is given."""
        return canonical(self.signed_payload(signer))

    @staticmethod
    def from_payload(d: object, expected_key: str | None = None, signer: Signer | None = None) -> "Entry":
        """Validate a decoded entry (and its signature, given a signer); raises ``InvalidEntry`` and nothing else.

        With ``expected_key`` (a lookup) the stored plan is not decoded: the key is the digest of the parts, so
        their hashes are the caller's own plan's. Otherwise the plan is decoded and the hashes re-derived.
        """
        if not isinstance(d, Mapping):
            raise InvalidEntry(f"entry must be a JSON object, got {type(d).__name__}")
        try:
            if signer is not None:
                try:
                    signer.verify_text(canonical({**d, "hits": 0}))  # what was signed: the stored text, hits 0
                except BadSignature as exc:
                    raise UnsignedEntry(str(exc)) from None
            schema = d.get("schema_version")
            if schema != SCHEMA_VERSION or schema.__class__ is not int:  # 5.0 and True are not schemas
                raise InvalidEntry(f"entry has schema {schema!r}, this prescreen reads schema {SCHEMA_VERSION}")
            raw_parts = d["parts"]
            versions = sorted(raw_parts["versions"].items(), key=lambda kv: str(kv[0]))
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in versions):
                raise InvalidEntry("parts.versions must map names to version strings")
            _finite(raw_parts, "ratio")  # an int ratio keeps its type: the key digests it as an int
            parts = KeyParts(
                plan_hash=_str(raw_parts, "plan_hash"),
                family_hash=_str(raw_parts, "family_hash"),
                device_kind=_str(raw_parts, "device_kind"),
                total_memory=_int(raw_parts, "total_memory"),
                ratio=raw_parts["ratio"],
                schema_version=_int(raw_parts, "schema_version"),
                estimator_version=_int(raw_parts, "estimator_version"),
                versions=tuple(versions),
            )
            key, plan_text, family, dynamic = _str(d, "key"), _str(d, "plan"), d["family"], d["dynamic"]
            decision = Decision.from_payload(d["decision"])
            if type(dynamic) is not bool:
                raise InvalidEntry(f"dynamic must be true or false, got {str(dynamic)[:40]}")
            if family is not None and not isinstance(family, dict):
                raise InvalidEntry("family must be a JSON object")
            entry = Entry(
                key=key, parts=parts, kernel=_str(d, "kernel"), plan_text=plan_text, dynamic=dynamic, family=family,
                decision=decision, created_at=_finite(d, "created_at"), host=_str(d, "host"), pid=_int(d, "pid"),
                hits=_int(d, "hits") if "hits" in d else 0,  # a bundle leaves hits out
            )
            if expected_key is not None and key != expected_key:
                raise InvalidEntry(f"entry is stored under {expected_key[:12]} but carries key {key[:12]}")
            if parts.digest() != key:
                raise InvalidEntry("entry key does not match its key parts")
            if decision.estimator_version != parts.estimator_version:
                raise InvalidEntry("decision and key disagree on the estimator version")
            if (decision.device_kind, decision.total_memory, decision.ratio) != (
                    parts.device_kind, parts.total_memory, parts.ratio):
                raise InvalidEntry("stored decision is for another device, memory size or ratio than its key")
            if decision.enable_auto_blockify != ((not decision.tune) and dynamic):
                raise InvalidEntry("stored decision's enable_auto_blockify does not match its action and plan")
            if expected_key is None:
                _check_tree(family, "family")  # (on a lookup the JSON parser bounds it)
                try:
                    stored_plan = KernelPlan.from_payload(_decode_plan(plan_text))
                except ValueError as exc:  # NotBounded
                    raise InvalidEntry(f"stored plan is invalid: {exc}") from None
                if plan_hashes(stored_plan) != (parts.plan_hash, parts.family_hash):
                    raise InvalidEntry("stored plan does not hash to the key's plan and family hashes")
                if stored_plan.is_dynamic != dynamic:
                    raise InvalidEntry("entry's dynamic flag does not match its stored plan")
            return entry
        except InvalidEntry:
            raise
        except RecursionError:
            raise InvalidEntry("entry nests too deeply") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError) as exc:
            raise InvalidEntry(f"malformed entry: {exc!r}") from None

    @staticmethod
    def from_json(text: str | bytes, expected_key: str | None = None, signer: Signer | None = None) -> "Entry":
        """Parse and validate stored text (with a signer, its signature first); raises ``InvalidEntry`` and nothing
        else. The plan line is kept as text."""
        if len(text) > MAX_ENTRY_BYTES:
            raise InvalidEntry(f"entry is {len(text)} bytes, over the {MAX_ENTRY_BYTES}-byte cap")
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidEntry("entry is not UTF-8 text") from None
        if signer is not None:
            try:
                signer.verify_text(text)
            except BadSignature as exc:
                raise UnsignedEntry(str(exc)) from None
        head, _, rest = text.partition("\n")
        details_text, _, rest = rest.partition("\n")
        record_text, newline, plan_text = rest.partition("\n")
        d = parse_json(head)
        if not newline:  # schemas 1 to 4 were one to three lines
            schema = d.get("schema_version") if isinstance(d, dict) else None
            raise InvalidEntry(f"entry has schema {schema!r} in fewer than four lines; this prescreen reads schema "
                               f"{SCHEMA_VERSION}'s four")
        if not isinstance(d, dict) or not d.keys() <= _HEAD_KEYS:
            raise InvalidEntry("entry's head line must be a JSON object of the head fields")
        details, record = parse_json(details_text), parse_json(record_text)
        decision = d.get(DECISION_FIELD)
        if not isinstance(details, dict) or not isinstance(decision, dict) or details.keys() & decision.keys():
            raise InvalidEntry("entry's details line must be a JSON object of fields its head's decision lacks")
        if not isinstance(record, dict) or record.keys() & d.keys() or PLAN_FIELD in record:
            raise InvalidEntry("entry's record line must be a JSON object of fields its head lacks")
        decision.update(details)
        d.update(record)
        d[PLAN_FIELD] = plan_text
        return Entry.from_payload(d, expected_key)


def outranks(new: Decision, old: Decision) -> bool:
    """Whether ``new`` replaces ``old`` under one key: only a stricter one does (``tune`` < a computed fallback <
    an observed OOM, a fact), so nothing loosens a stored decision."""
    return (not new.tune, is_observed_oom(new)) > (not old.tune, is_observed_oom(old))


def read_stored(
    text: str | bytes, expected_key: str | None = None, signer: Signer | None = None
) -> tuple[Entry, str | None]:
    """An entry read back from a store, and why its signature was not accepted (None when it was); raises
    ``InvalidEntry``. A signature is what it takes to loosen: an unverified ``tune`` is refused, an unverified
    stricter entry served all the same (if it is wrong it costs speed, never an OOM)."""
    try:
        return Entry.from_json(text, expected_key, signer), None
    except UnsignedEntry as refused:
        entry = Entry.from_json(text, expected_key, None)
        if entry.decision.tune:
            raise refused from None
        return entry, str(refused)


def parse_json(text: str) -> object:
    """JSON text (a line of a capped entry), with finite numbers only; raises ``InvalidEntry``."""
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise InvalidEntry("entry is JSON nested too deeply") from None
    except ValueError as exc:
        raise InvalidEntry(f"entry is not JSON: {exc}") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_finite_float, parse_float=_finite_float)  # NaN, Infinity, 1e400
_INT_LIMIT = 2**63  # what SQLite, Redis and every counter here hold


def _int(d: Mapping[str, object], name: str) -> int:
    value = d[name]
    if type(value) is not int or not 0 <= value < _INT_LIMIT:
        raise InvalidEntry(f"{name} must be an integer in [0, 2**63), got {str(value)[:40]}")
    return value


def _finite(d: Mapping[str, object], name: str) -> float:
    """A finite number below 2**63 as a float (checked after the conversion, which can round 2**63 - 1 up)."""
    value = d[name]
    if type(value) not in (int, float) or not abs(float(value)) < _INT_LIMIT:  # type: ignore[arg-type]
        raise InvalidEntry(f"{name} must be a finite number, got {str(value)[:40]}")
    return float(value)  # type: ignore[arg-type]


def _str(d: Mapping[str, object], name: str) -> str:
    found = d[name]
    if not isinstance(found, str):
        raise InvalidEntry(f"{name} must be a string, got {type(found).__name__}")
    return found


def _check_tree(value: object, what: str) -> None:
    """Raise ``InvalidEntry`` if ``value`` nests deeper than ``MAX_DEPTH`` or holds NaN or an infinity (which a
    bundle's JSON parser lets through); checked without recursion."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidEntry(f"stored {what} holds the number {item!r}")
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise InvalidEntry(f"stored {what} nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))


def _decode_plan(text: str) -> dict[str, object]:
    """The plan payload in an entry's plan text: a JSON object nesting at most ``MAX_DEPTH`` levels."""
    plan = parse_json(text)
    if not isinstance(plan, dict):
        raise InvalidEntry(f"stored plan must be a JSON object, got {type(plan).__name__}")
    _check_tree(plan, "plan")
    return plan

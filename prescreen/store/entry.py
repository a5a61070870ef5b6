"""A stored decision: JSON text, validated on the way back in.

Schema 5's stored text is four lines (``trust.canonical``), each sorted-key
JSON: the head (key, schema, the decision's verdict, ``dynamic``, the
signature), the decision's details (its per-group bytes and dominant
argument), the record (key parts, kernel, family, provenance, hits) and the
plan's canonical JSON text. Every read decodes and checks every line but the
plan; listings, imports, bundles and ``inspect --verify`` decode the plan too
(``Entry.plan``). In a payload (bundles, ``inspect --json``) the details are in
the decision and the plan is one string field, ``plan``. ``dynamic`` (the plan
has an axis without a static value) is stored beside the decision so a lookup
can check the decision's ``enable_auto_blockify`` without decoding the plan;
wherever the plan is decoded, ``dynamic`` must match it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

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
    def new(
        key: str, parts: KeyParts, plan: KernelPlan, family: dict[str, object] | None, decision: Decision
    ) -> "Entry":
        return Entry(
            key=key,
            parts=parts,
            kernel=plan.display_name,
            plan_text=canonical_json(plan.to_payload()),
            dynamic=plan.is_dynamic,
            family=family,
            decision=decision,
            created_at=time.time(),
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    @property
    def plan(self) -> dict[str, object]:
        """The stored plan payload, decoded (and depth-checked) on each access.

        Empty when the stored text is not a JSON object within the depth cap: a lookup
        does not read the plan, so such an entry still serves hits, while ``verify_entry``
        says False for it and an import or bundle refuses it (``from_payload`` decodes it).
        """
        try:
            return _decode_plan(self.plan_text)
        except InvalidEntry:
            return {}

    def with_hits(self, hits: int) -> "Entry":
        return dataclasses.replace(self, hits=hits)

    def to_payload(self) -> dict[str, object]:
        return {
            "schema_version": self.schema_version,
            "key": self.key,
            "parts": self.parts.to_payload(),
            "kernel": self.kernel,
            "plan": self.plan_text,
            "dynamic": self.dynamic,
            "family": self.family,
            "decision": self.decision.to_payload(),
            "created_at": self.created_at,
            "host": self.host,
            "pid": self.pid,
            "hits": self.hits,
        }

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

        With ``expected_key`` (a lookup) the stored plan is not decoded: the caller derived the key from its own
        plan, and the key is the digest of the parts, so the parts' hashes are the caller's plan's (the service
        checks ``dynamic`` against that plan). Otherwise (a listing, an import, a bundle) the plan is decoded and
        the hashes and the dynamic flag re-derived from it.
        """
        if not isinstance(d, Mapping):
            raise InvalidEntry(f"entry must be a JSON object, got {type(d).__name__}")
        try:
            if signer is not None:
                try:
                    signer.verify(d)
                except BadSignature as exc:
                    raise UnsignedEntry(str(exc)) from None
            schema = d.get("schema_version")
            if schema != SCHEMA_VERSION or schema.__class__ is not int:  # 5.0 and True are not schemas
                raise InvalidEntry(f"entry has schema {schema!r}, this prescreen reads schema {SCHEMA_VERSION}")
            raw_parts = d["parts"]
            versions = raw_parts["versions"]
            if not isinstance(versions, Mapping):
                raise InvalidEntry("parts.versions must be a JSON object")
            parts = KeyParts(
                plan_hash=_str(raw_parts, "plan_hash"),
                family_hash=_str(raw_parts, "family_hash"),
                device_kind=_str(raw_parts, "device_kind"),
                total_memory=_int(raw_parts, "total_memory"),
                ratio=_ratio(raw_parts),
                schema_version=_int(raw_parts, "schema_version"),
                estimator_version=_int(raw_parts, "estimator_version"),
                versions=_versions(versions),
            )
            key = _str(d, "key")
            decision = Decision.from_payload(d["decision"])
            plan_text = _str(d, "plan")
            dynamic = d["dynamic"]
            if type(dynamic) is not bool:
                raise InvalidEntry(f"dynamic must be true or false, got {str(dynamic)[:40]}")
            record = _record_fields(d)
            entry = Entry(key=key, parts=parts, plan_text=plan_text, dynamic=dynamic, decision=decision, **record)
            if expected_key is not None and key != expected_key:
                raise InvalidEntry(f"entry is stored under {expected_key[:12]} but carries key {key[:12]}")
            if parts.digest() != key:
                raise InvalidEntry("entry key does not match its key parts")
            if decision.estimator_version != parts.estimator_version:
                raise InvalidEntry("decision and key disagree on the estimator version")
            check_decision(decision, parts, dynamic)
            if expected_key is None:
                _check_depth(record["family"], "family")  # (on a lookup the JSON parser's recursion limit bounds it)
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
        """Parse and validate stored text; raises ``InvalidEntry`` (never anything else) naming what is wrong.

        With a signer the signature is checked on the text itself, before parsing. The plan line is kept as text.
        """
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
        if not newline:
            schema = d.get("schema_version") if isinstance(d, dict) else None
            if schema != SCHEMA_VERSION:
                raise InvalidEntry(f"entry has schema {schema!r}, this prescreen reads schema {SCHEMA_VERSION}")
            raise InvalidEntry(f"entry is not four lines (schema {SCHEMA_VERSION} stores a head line, the decision's "
                               "details line, the record line, then the plan line)")
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


def strictness(decision: Decision) -> int:
    """How firmly ``decision`` keeps a benchmark from running: 0 ``tune``, 1 a computed fallback, 2 an
    observed-OOM fallback (a fact). A store keeps the strictest valid entry under a key (``outranks``)."""
    if decision.tune:
        return 0
    return 2 if is_observed_oom(decision) else 1


def outranks(new: Decision, old: Decision) -> bool:
    """Whether ``new`` replaces ``old`` under one key: only a stricter entry does (a fact beats an estimate,
    and nothing loosens a stored decision)."""
    return strictness(new) > strictness(old)


def read_stored(
    text: str | bytes, expected_key: str | None = None, signer: Signer | None = None
) -> tuple[Entry, str | None]:
    """An entry read back from a store, under the trust rule; raises ``InvalidEntry``.

    A signature is what it takes to *loosen* a decision: with a signer, an entry whose signature
    is missing or does not verify (another key, a rollout, a forgery) is refused when it says
    ``tune``, but a valid stricter one (a fallback, an observed OOM) is served all the same: if it
    is wrong it costs speed, never an OOM. Returns the entry and, where its signature was not
    accepted, why (None otherwise).
    """
    try:
        return Entry.from_json(text, expected_key, signer), None
    except UnsignedEntry as refused:
        entry = Entry.from_json(text, expected_key, None)
        if entry.decision.tune:
            raise refused from None
        return entry, str(refused)


_HEAD_KEYS = HEAD_FIELDS | {SIGNATURE_FIELD}


def _record_fields(d: Mapping[str, object]) -> dict[str, Any]:
    """An entry's record fields in ``d``, validated: raises ``InvalidEntry`` (``KeyError`` for a missing one;
    ``hits`` may be left out, as bundles leave it)."""
    family = d["family"]
    if family is not None and not isinstance(family, dict):
        raise InvalidEntry("family must be a JSON object")
    return {"created_at": _finite(d, "created_at"), "family": family, "hits": _int(d, "hits") if "hits" in d else 0,
            "host": _str(d, "host"), "kernel": _str(d, "kernel"), "pid": _int(d, "pid")}


def parse_json(text: str) -> object:
    """JSON text of at most ``MAX_ENTRY_BYTES``, with finite numbers only; raises ``InvalidEntry``."""
    if len(text) > MAX_ENTRY_BYTES:
        raise InvalidEntry(f"entry is {len(text)} bytes, over the {MAX_ENTRY_BYTES}-byte cap")
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise InvalidEntry("entry is JSON nested too deeply") from None
    except ValueError as exc:
        raise InvalidEntry(f"entry is not JSON: {exc}") from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number prescreen stores")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
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


def _ratio(d: Mapping[str, object]) -> float:
    """A key's ratio as written: an int ratio (torch_npu's ratio set in code) keeps its type, since its budget
    is exact where a float's product rounds (it is a key part of its own, and the key digests it as an int)."""
    _finite(d, "ratio")
    return d["ratio"]  # type: ignore[return-value]


def _str(d: Mapping[str, object], name: str) -> str:
    found = d[name]
    if not isinstance(found, str):
        raise InvalidEntry(f"{name} must be a string, got {type(found).__name__}")
    return found


def _versions(versions: Mapping[object, object]) -> tuple[tuple[str, str], ...]:
    pairs = sorted(versions.items(), key=lambda kv: str(kv[0]))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise InvalidEntry("parts.versions must map names to version strings")
    return tuple(pairs)  # type: ignore[arg-type]


def _check_depth(value: object, what: str) -> None:
    """Raise ``InvalidEntry`` if ``value`` nests deeper than ``MAX_DEPTH`` (checked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidEntry(f"stored {what} nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))


def _decode_plan(text: str) -> dict[str, object]:
    """The plan payload in an entry's plan text: a JSON object nesting at most ``MAX_DEPTH`` levels."""
    plan = parse_json(text)
    if not isinstance(plan, dict):
        raise InvalidEntry(f"stored plan must be a JSON object, got {type(plan).__name__}")
    _check_depth(plan, "plan")
    return plan


def check_decision(decision: Decision, parts: KeyParts, dynamic: bool) -> None:
    """Check a stored decision against its key and plan; raises ``InvalidEntry``.

    ``Decision.from_payload`` checks the decision's own numbers; this catches a
    self-consistent decision for another device, memory size or ratio than the
    key says, and a blockify flag that does not match the plan.
    """
    if (decision.device_kind, decision.total_memory, decision.ratio) != (
        parts.device_kind,
        parts.total_memory,
        parts.ratio,
    ):
        raise InvalidEntry("stored decision is for another device, memory size or ratio than its key")
    if decision.enable_auto_blockify != ((not decision.tune) and dynamic):
        raise InvalidEntry("stored decision's enable_auto_blockify does not match its action and plan")

"""Signed entries for a fleet: an HMAC-SHA256 over each entry's key and value, with a shared secret.

Without a secret, the store is trusted input: whoever can write the cache
directory, the Redis database or a bundle decides what prescreen does. With
``PRESCREEN_SIGNING_KEY`` (the secret itself) or ``PRESCREEN_SIGNING_KEY_FILE``
(a file holding it, readable by its owner only), every entry written carries
``"signature": "hmac-sha256:<hex>"`` over its stored text (``canonical``: the
head line of sorted-key JSON with no signature, a newline, the details, record
and plan lines, ``hits`` as 0), which holds the key. The signature is the head line's last
field, so a lookup checks it on the text as stored, before parsing it; a
bundle entry is re-serialized first. Read back from disk,
Redis or a bundle, an entry that is unsigned or whose signature does not
verify is a miss (one warning), and ``import`` refuses it. The signature is an
optional field: a prescreen without a secret reads signed entries as before.

The secret is normalized one way wherever it comes from (``normalize_key``):
whitespace around it (a trailing newline from ``echo`` or an editor, spaces)
is stripped, in the variable and in the file alike, so
``PRESCREEN_SIGNING_KEY="secret\n"`` and a key file holding ``secret`` sign
alike.

What a signature guards is *loosening* (``entry.read_stored``): a stored
``tune`` must verify, while a stricter entry (a fallback, an observed OOM) is
served whatever its signature, so a fact is never masked during a key
rollout (none -> key) or rotation (A -> B), nor overwritten: a store keeps the
strictest valid entry under a key (``entry.outranks``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from prescreen.decision import DETAIL_FIELDS
from prescreen.errors import ConfigError
from prescreen.plan import canonical_json
from prescreen.store.secure import NotRegularFile, open_regular

SIGNING_KEY_ENV = "PRESCREEN_SIGNING_KEY"
SIGNING_KEY_FILE_ENV = "PRESCREEN_SIGNING_KEY_FILE"
MIN_KEY_BYTES = 16
SIGNATURE_FIELD = "signature"
_SCHEME = "hmac-sha256:"
# "signature" sorts after every other field of an entry's head, so it closes the head line.
_TAIL = re.compile(r',"signature":"(hmac-sha256:[0-9a-f]{64})"\}\Z')


class BadSignature(ValueError):
    """An entry without a valid signature where one is required; the message says which."""


class Signer:
    """Signs and verifies entry payloads with one shared secret."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"the signing key is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes")
        self._key = key

    def __repr__(self) -> str:
        return "Signer(<secret>)"

    def _mac(self, text: str) -> str:
        return _SCHEME + hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def sign(self, payload: Mapping[str, object]) -> str:
        """The signature of an entry payload: over its canonical text with hits 0 and no signature."""
        body = {k: v for k, v in payload.items() if k != SIGNATURE_FIELD}
        body["hits"] = 0
        return self._mac(canonical(body))

    def verify(self, payload: Mapping[str, object]) -> None:
        """Raise ``BadSignature`` unless ``payload`` (a parsed entry, e.g. from a bundle) carries our signature."""
        found = payload.get(SIGNATURE_FIELD)
        if found is None:
            raise BadSignature("entry is unsigned and a signing key is configured")
        if not isinstance(found, str) or not hmac.compare_digest(found, self.sign(payload)):
            raise BadSignature("entry's signature does not verify with the configured signing key")

    def verify_text(self, text: str) -> None:
        """Raise ``BadSignature`` unless stored ``text`` is canonical with our signature as its last field."""
        head, newline, rest = text.partition("\n")  # rest: the details, record and plan lines
        match = _TAIL.search(head)
        if match is None:
            if f'"{SIGNATURE_FIELD}"' in head:
                raise BadSignature("entry's signature is malformed")
            raise BadSignature("entry is unsigned and a signing key is configured")
        if not hmac.compare_digest(match.group(1), self._mac(head[: match.start()] + "}" + newline + rest)):
            raise BadSignature("entry's signature does not verify with the configured signing key")


PLAN_FIELD = "plan"
DECISION_FIELD = "decision"
#: An entry's fields on its head line (with the signature): what a hit needs.
HEAD_FIELDS = frozenset({DECISION_FIELD, "dynamic", "key", "schema_version"})


def canonical(payload: Mapping[str, object]) -> str:
    """The one text of an entry payload that is signed and stored (``Entry.to_json`` writes it).

    Four lines, each JSON with sorted keys and no spaces:

    1. the head: ``HEAD_FIELDS`` (and the signature), the decision without its ``DETAIL_FIELDS``;
    2. the decision's details (per-group bytes, dominant argument);
    3. the record: every other field but the plan (key parts, family, kernel, provenance, hits);
    4. the plan's own canonical JSON text (``payload["plan"]``, a string).

    A lookup parses the first line only. No line holds a raw newline (JSON
    escapes them). A payload whose plan is not a string (a hostile bundle) gets
    that value's JSON as its last line: it signs and verifies, and is refused as
    an entry.
    """
    head: dict[str, object] = {}
    record: dict[str, object] = {}
    for name, value in payload.items():
        if name in HEAD_FIELDS or name == SIGNATURE_FIELD:
            head[name] = value
        elif name != PLAN_FIELD:
            record[name] = value
    decision = head.get(DECISION_FIELD)
    details: dict[str, object] = {}
    if isinstance(decision, Mapping):
        head[DECISION_FIELD] = {k: v for k, v in decision.items() if k not in DETAIL_FIELDS}
        details = {k: decision[k] for k in DETAIL_FIELDS if k in decision}
    plan = payload.get(PLAN_FIELD)
    plan_line = plan if isinstance(plan, str) else canonical_json(plan)
    return "\n".join((canonical_json(head), canonical_json(details), canonical_json(record), plan_line))


def _read_key_file(path: Path) -> bytes:
    try:
        fd, st = open_regular(path)  # a FIFO, a directory or a symlink is refused at once, never waited on
    except NotRegularFile as exc:
        raise ConfigError(f"{SIGNING_KEY_FILE_ENV}={str(path)!r}: {exc.strerror}") from None
    except OSError as exc:
        raise ConfigError(f"{SIGNING_KEY_FILE_ENV}={str(path)!r}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{SIGNING_KEY_FILE_ENV}={str(path)!r} has mode {stat.S_IMODE(st.st_mode):04o}; "
                "a key file must be readable by its owner only (chmod 600)"
            )
        return normalize_key(handle.read(4096))


def normalize_key(raw: bytes) -> bytes:
    """The secret as signing uses it: ``raw`` without the ASCII whitespace around it (one rule for the
    variable and the file)."""
    return raw.strip()


def signer_from_env() -> Signer | None:
    """The configured signer, or None without a secret; raises ``ConfigError`` for a bad one."""
    secret = os.environ.get(SIGNING_KEY_ENV, "")
    path = os.environ.get(SIGNING_KEY_FILE_ENV, "").strip()
    if secret and path:
        raise ConfigError(f"set {SIGNING_KEY_ENV} or {SIGNING_KEY_FILE_ENV}, not both")
    if path:
        return Signer(_read_key_file(Path(path).expanduser()))
    if secret:
        return Signer(normalize_key(secret.encode()))
    return None

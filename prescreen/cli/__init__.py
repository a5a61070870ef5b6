"""The prescreen command: warm, inspect, report, clear, stats, export, import, load.

Only ``warm`` of a model and ``load`` import torch. Bad input raises a ConfigError (or a click usage error), which
:class:`PrescreenGroup` prints as one ``error:`` line, exit status 2.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click

from prescreen.cli import store_commands
from prescreen.cli.warm_command import given_as, warm
from prescreen.display import visible
from prescreen.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from prescreen.store.base import Store

__all__ = ["HeldStoreWarnings", "PrescreenGroup", "StoreOpener", "cli", "fail", "main"]


def fail(message: str) -> NoReturn:
    """One clear line on stderr, exit code 2, no traceback (control characters shown as escapes)."""
    line = visible(" ".join(message.split()))
    click.echo(f"{click.style('error:', fg='red', bold=True)} {line}", err=True)
    sys.exit(2)


def _usage_line(exc: click.ClickException) -> str:
    """Click's usage error as one line in prescreen's wording, naming where a bad value came from (the option,
    or the ``--spec`` key), with where to find help."""
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    if type(exc) is click.BadParameter and ctx is not None and param is not None and param.name:
        text = f"{given_as(ctx, param.name)}: {exc.message[:1].lower()}{exc.message[1:]}"
    else:
        text = re.sub(r"^Missing (argument|option) '([^']+)'", r"missing \1 \2", exc.format_message())
        text = text[:1].lower() + text[1:]
    text = " ".join(text.split()).rstrip(".")
    return text if ctx is None else f"{text} (see '{ctx.command_path} --help')"


class _VisibleStderr(logging.Handler):
    """prescreen's warnings on the current stderr, as logging's last resort would print them (the message alone),
    but with control characters shown as escapes: a warning can hold a path or a value from the store."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(visible(self.format(record)) + "\n")  # the stream of now (click's runner swaps it)
        except Exception:  # pragma: no cover - as logging's own handlers do
            self.handleError(record)


class PrescreenGroup(click.Group):
    """A group whose every failure, a ConfigError or a click usage error, is one ``error:`` line and exit 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        log = logging.getLogger("prescreen")
        if not any(isinstance(h, _VisibleStderr) for h in log.handlers):
            log.addHandler(_VisibleStderr())
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            rv = 0
        except click.ClickException as exc:
            fail(_usage_line(exc))
        except ConfigError as exc:
            fail(str(exc))
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


class StoreOpener:
    """The group's store settings; the store is opened when a command first asks for it (``--help`` never does)."""

    def __init__(self, cache_dir: str | None, redis_url: str | None) -> None:
        self.cache_dir, self.redis_url = cache_dir, redis_url
        self._store: Store | None = None

    def store(self, writable: bool = True) -> Store:
        """The configured store, or a ConfigError naming why it is unusable (one line: its warnings are held while
        it opens). Reading commands accept a read-only store (a cache baked into an image)."""
        if self._store is None:
            from prescreen.store import open_store

            with HeldStoreWarnings() as held:
                store = open_store(cache_dir=self.cache_dir, redis_url=self.redis_url)
                health = store.stats()
            readable = health.entries > 0 or "read-only" in (health.detail or "")
            if not health.healthy and (writable or not readable):
                why = held.first() or health.detail or "not usable"
                raise ConfigError(f"store unreachable: {health.backend} at {health.location}: {why}")
            held.replay()
            self._store = store
            click.get_current_context().call_on_close(store.close)  # writes the batched hit counts
        return self._store


class HeldStoreWarnings(logging.handlers.BufferingHandler):
    """Holds ``prescreen.store`` warnings back for as long as it is entered; :meth:`replay` logs them."""

    def __init__(self) -> None:
        super().__init__(capacity=1 << 16)
        self.setLevel(logging.WARNING)
        self._log = logging.getLogger("prescreen.store")
        self._propagate = True

    def __enter__(self) -> HeldStoreWarnings:
        self._propagate, self._log.propagate = self._log.propagate, False
        self._log.addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._log.removeHandler(self)
        self._log.propagate = self._propagate

    def first(self) -> str | None:
        """The first fault as ``what (cause)``, without the logger's store prefix."""
        if not self.buffer:
            return None
        r = self.buffer[0]
        if isinstance(r.args, tuple) and len(r.args) == 4:  # Store.warn_once: backend, location, what, exc
            return f"{r.args[2]} ({r.args[3]})"
        return r.getMessage()

    def replay(self) -> None:
        for r in self.buffer:
            self._log.handle(r)


def _check_redis_url(url: str, source: str) -> None:
    """A URL redis-py can open, else a ConfigError naming ``source`` (the option or the variable it came from)."""
    from urllib.parse import urlsplit

    try:
        scheme = urlsplit(url).scheme if "://" in url else ""
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket: redis://:pw@[::1/0
        scheme, why = None, f"is not a valid URL ({exc})"
    else:
        why = "is not a Redis URL (expected redis://HOST:PORT/DB, rediss://... or unix:///path/to/socket)"
    if scheme not in ("redis", "rediss", "unix"):
        from prescreen.store.redis_store import redact_url

        raise ConfigError(f"{source} {redact_url(url)!r} {why}")


@click.group(cls=PrescreenGroup, context_settings={"max_content_width": 120, "help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", envvar="PRESCREEN_CACHE_DIR", metavar="DIR",
              help="The diskcache directory of the store [env PRESCREEN_CACHE_DIR].")
@click.option("--redis-url", envvar="PRESCREEN_REDIS_URL", metavar="URL",
              help="A fleet store behind the local one, e.g. redis://127.0.0.1:6379/0 [env PRESCREEN_REDIS_URL].")
@click.version_option(package_name="prescreen")
@click.pass_context
def cli(ctx: click.Context, cache_dir: str | None, redis_url: str | None) -> None:
    """Pre-screen torch.compile autotune benchmarks against device memory, once per shape family."""
    if cache_dir is not None and not cache_dir.strip():  # not the current directory by accident
        raise ConfigError(f"{given_as(ctx, 'cache_dir')} is empty (give a directory, or leave it out for the default)")
    if redis_url:
        _check_redis_url(redis_url, given_as(ctx, "redis_url"))
    ctx.obj = StoreOpener(cache_dir, redis_url)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: every error is one ``error:`` line and exit status 2."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="prescreen")


for _command in (warm, *store_commands.COMMANDS):
    cli.add_command(_command)

"""The CLI boundary: a user's mistake prints one line (plus a short hint), not a traceback.

What counts as a user's mistake: an error this project raises on purpose (a ``raise`` of a
``ValueError``, ``TypeError``, ``OSError``, ``RuntimeError`` or ``ImportError`` in its own code,
found anywhere in the exception's cause chain, however deep jsonargparse or Lightning wrapped it),
a command line jsonargparse cannot parse, a Lightning misconfiguration, or an ``OSError``. Anything
else is a bug and keeps its traceback. ``SPECDIFF_DEBUG=1`` keeps the traceback for all of them.
"""

from __future__ import annotations

import linecache
import os
import sys
from argparse import ArgumentError
from pathlib import Path
from types import TracebackType

__all__ = ["DEBUG_ENV", "user_message", "report", "condense"]

DEBUG_ENV = "SPECDIFF_DEBUG"
_PACKAGE = str(Path(__file__).resolve().parents[1])
_OURS = (ValueError, TypeError, OSError, RuntimeError, ImportError)
_HINT = f"(set {DEBUG_ENV}=1 for the full traceback)"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _innermost_frame(tb: TracebackType | None) -> tuple[str, int] | None:
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno


def _raised_by_us(exc: BaseException) -> bool:
    """Raised by a ``raise`` statement in this package: a message written for the user (an error
    raised implicitly in our code, e.g. an ``AttributeError``, is a bug)."""
    where = _innermost_frame(exc.__traceback__)
    if not isinstance(exc, _OURS) or where is None:
        return False
    filename, lineno = where
    return filename.startswith(_PACKAGE) and linecache.getline(filename, lineno).lstrip().startswith("raise")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def condense(exc: BaseException) -> str:
    """One line for a jsonargparse error: the key it names and the innermost reason
    (``Parser key "model": Option 'foo' is not accepted``), not the union-subtype report."""
    chain = _chain(exc)
    head = _first_line(str(exc))
    reason = _first_line(str(chain[-1]))
    if head.endswith(":") and reason and reason != head:
        return f"{head} {reason}"
    return head or reason


def _is_misconfiguration(exc: BaseException) -> bool:
    return type(exc).__name__ == "MisconfigurationException"


def user_message(exc: BaseException) -> tuple[str, int] | None:
    """``(message, exit status)`` when ``exc`` is a user's mistake, else None (a bug)."""
    chain = _chain(exc)
    ours = [e for e in chain if _raised_by_us(e)]
    if ours:
        return str(ours[-1]).strip(), 1
    if isinstance(exc, ArgumentError) or type(exc).__name__ == "ArgumentError":
        return condense(exc), 2
    if _is_misconfiguration(exc) or isinstance(exc, OSError):
        return _first_line(str(exc)), 1
    return None


def report(exc: BaseException, command: str | None = None) -> int | None:
    """Print ``exc`` as ``error: <message>`` plus a hint and return the exit status; None (the
    caller re-raises it) when it is a bug or :data:`DEBUG_ENV` is set."""
    found = None if os.environ.get(DEBUG_ENV) else user_message(exc)
    if found is None:
        return None
    message, status = found
    hint = _HINT
    if status == 2 and command:
        hint = (
            f"(`python -m specdiff_lightning {command} --help` lists the arguments; {DEBUG_ENV}=1: traceback)"
        )
    sys.stderr.write(f"error: {message}\n{hint}\n")
    return status

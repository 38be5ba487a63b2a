"""The lines a command prints beside its results: progress on stdout, warnings and notes on stderr,
each flushed at once (they show up as they happen, also when piped to a file)."""

from __future__ import annotations

import sys

__all__ = ["say", "warn", "note"]


def say(line: str) -> None:
    """A progress line (one per epoch, what a run trains), on stdout."""
    print(line, flush=True)


def warn(line: str) -> None:
    """``sol-ext: warning: LINE`` on stderr: something the user should change or look at."""
    print(f"sol-ext: warning: {line}", file=sys.stderr, flush=True)


def note(line: str) -> None:
    """``sol-ext: note: LINE`` on stderr: what a command left out, not a problem with its input or
    result."""
    print(f"sol-ext: note: {line}", file=sys.stderr, flush=True)

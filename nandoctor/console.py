"""The consoles: one for a report on a given stream, stderr for nandoctor's own messages.

Colour follows rich's rules, per stream: none when the stream is not a terminal, none with
NO_COLOR. Consoles are made per call, not at import, so a test's redirected streams are
honoured. No emoji codes: what they print is the user's text (a path `ds.py:boom`, a code
line `d[":fire:"]`), never turned into pictures.
"""
import sys
from typing import TextIO

from rich.console import Console
from rich.markup import escape


def report_console(stream: TextIO) -> Console:
    """The console a report is rendered with, for the stream it will be written to."""
    return Console(file=stream, highlight=False, soft_wrap=False, emoji=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False, soft_wrap=True, emoji=False)


def error_line(message: str) -> None:
    """Print nandoctor's one-line error message on stderr."""
    stderr_console().print(f"[bold red]nandoctor:[/] {escape(message)}")


def note_line(message: str) -> None:
    """Print a one-line note from nandoctor on stderr (never mixed into the script's stdout)."""
    stderr_console().print(f"[dim]nandoctor:[/] {escape(message)}")

"""The two consoles: stdout for reports, stderr for nandoctor's own messages.

Colour follows rich's rules: none when the stream is not a terminal, none with NO_COLOR.
"""
import sys

from rich.console import Console
from rich.markup import escape


def stdout_console() -> Console:
    # Made per call, not at import, so a test's redirected sys.stdout is honoured.
    return Console(file=sys.stdout, highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def error_line(message: str) -> None:
    """Print nandoctor's one-line error message on stderr."""
    stderr_console().print(f"[bold red]nandoctor:[/] {escape(message)}")


def note_line(message: str) -> None:
    """Print a one-line note from nandoctor on stderr (never mixed into the script's stdout)."""
    stderr_console().print(f"[dim]nandoctor:[/] {escape(message)}")

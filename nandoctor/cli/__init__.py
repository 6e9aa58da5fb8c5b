"""The command line: `nandoctor run ...` and `nandoctor check-data ...`.

Each command lives in its own module and registers itself on `app`. Commands raise
`NandoctorError` or return an exit status; only `main()` prints errors and exits, so every
failure of nandoctor's own is one line on stderr with the contract's exit status.
"""
from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from nandoctor.console import error_line
from nandoctor.errors import ExitCode, NandoctorError

app = typer.Typer(
    name="nandoctor",
    help="Find the first NaN/Inf in a PyTorch training run: the op, the line, the root and the fix.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _group() -> None:
    """Find the first NaN/Inf in a PyTorch training run: the op, the line, the root and the fix."""


# Importing the command modules registers them on `app`.
from nandoctor.cli import check_data as _check_data  # noqa: E402,F401
from nandoctor.cli import run as _run  # noqa: E402,F401


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `nandoctor` console script and `python -m nandoctor`."""
    command = typer.main.get_command(app)
    try:
        status = command.main(args=argv, prog_name="nandoctor", standalone_mode=False)
    except typer.Exit as done:  # --help and friends
        status = done.exit_code
    except TyperException as exc:  # bad option, missing argument: one line, exit 2
        if type(exc).__name__ == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            print(exc.ctx.get_help())
        else:
            error_line(_usage_message(exc))
        status = ExitCode.USAGE
    except typer.Abort:
        status = ExitCode.INTERRUPTED
    except NandoctorError as exc:
        error_line(str(exc))
        status = exc.exit_code
    sys.exit(int(status or 0))


def _usage_message(exc: TyperException) -> str:
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message

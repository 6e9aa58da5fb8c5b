"""The command line: `nandoctor run ...` and `nandoctor check-data ...`.

Each command lives in its own module and registers itself on `app`. Commands raise
`NandoctorError` or return an exit status; only `main()` prints errors and exits, so every
failure of nandoctor's own is one line on stderr with the contract's exit status.
"""
from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.core import TyperCommand
from typer.exceptions import TyperException

from nandoctor.console import error_line
from nandoctor.errors import ExitCode, NandoctorError


class Command(TyperCommand):
    """A command whose help reads like a man page: arguments by their metavar alone
    (`PATH...`, not typer's `PATH <list[str]>`), the usage line in click's own style
    (`[OPTIONS] PATH...`, optional arguments in brackets). Options give their metavar
    (`PATH`, `N`, `MODULE`) where they are declared."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = argument_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: typer.Context, formatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append((argument_name(param), record[1]))
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def argument_name(param) -> str:
    """`SCRIPT`, `PATH...`: an argument as help and usage show it."""
    return (param.metavar or param.name.upper()) + ("..." if param.nargs != 1 else "")


app = typer.Typer(
    name="nandoctor",
    help="Find the first NaN/Inf in a PyTorch training run: the op, the line, the root and the fix.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def version_line() -> str:
    """`nandoctor 0.1.0 (torch 2.13.0)`, read from the installed packages' metadata, never by
    importing torch: measured here, `import torch` costs 1.5 s of CPU, the whole
    `nandoctor --version` 0.17 s."""
    from importlib import metadata

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    from nandoctor import __version__

    torch = version("torch")
    return f"nandoctor {version('nandoctor') or __version__} ({'torch ' + torch if torch else 'torch not installed'})"


def _print_version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def _group(
    version: Optional[bool] = typer.Option(
        None, "--version", is_eager=True, callback=_print_version, expose_value=True,
        help="Print nandoctor's version and torch's, and exit."),
) -> None:
    """Find the first NaN/Inf in a PyTorch training run: the op, the line, the root and the fix."""


# Importing the command modules registers them on `app`.
from nandoctor.cli import check_data as _check_data  # noqa: E402,F401
from nandoctor.cli import run as _run  # noqa: E402,F401

# A command that names no class of its own gets the man-page help above.
for _info in app.registered_commands:
    if _info.cls is None:
        _info.cls = Command


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
            error_line(_usage_message(exc, argv))
        status = ExitCode.USAGE
    except typer.Abort:
        status = ExitCode.INTERRUPTED
    except NandoctorError as exc:
        error_line(str(exc))
        status = exc.exit_code
    sys.exit(int(status or 0))


def _usage_message(exc: TyperException, argv: list[str] | None = None) -> str:
    """click's message, and where to read more: `No such option: --bogus (see 'nandoctor
    run --help')`. Some errors (an option missing its value) come without their command:
    it is then read from the command line."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else _command_path(sys.argv[1:] if argv is None else argv)
    return f"{message} (see '{path} --help')"


def _command_path(argv: list[str]) -> str:
    command = next((a for a in argv if not a.startswith("-")), None)
    return f"nandoctor {command}" if command in {"run", "check-data"} else "nandoctor"

"""The exceptions nandoctor's own code raises, each carrying the exit status it ends with.

Commands never call `sys.exit`; they raise one of these and `nandoctor.cli.main` turns it
into one line on stderr and the exit status (the contract's table lives in `ExitCode`).
"""
from enum import IntEnum


class ExitCode(IntEnum):
    CLEAN = 0
    SCRIPT_ERROR = 1  # what python itself exits with on an uncaught exception
    USAGE = 2
    FOUND = 3  # a non-finite value (run) or a data problem (check-data)
    INTERRUPTED = 130  # what a shell reports for a program ended by Ctrl-C


class NandoctorError(Exception):
    """An error nandoctor reports as one line, without a traceback."""

    exit_code = ExitCode.USAGE


class UsageError(NandoctorError):
    """Bad options, a missing script, an unreadable config: the user's command line is wrong."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A --config file that cannot be read or does not fit the schema."""


def error_message(error: BaseException) -> str:
    """`str(error)` of the script's exception, or what Python prints when the exception's
    own `__str__` raises."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - any error of the script's own __str__
        return "<exception str() failed>"

"""torchrun, without its own traceback when a rank stops: `python -m nandoctor.cli.quiet_torchrun ARGS`.

`nandoctor run --nproc-per-node N` launches the ranks through torch.distributed.run. When a
rank stops the run (exit 3: it printed the report) or the script raised in a rank (which
printed the script's traceback, as python would), torchrun's agent adds its own traceback
(`ChildFailedError`, a table of every rank) and log lines about the peers it then
terminated. All of that repeats, less clearly, what the ranks said. Here the launch runs
the same `torch.distributed.run` code, and a failed rank becomes this process's exit status
instead of a traceback. A rank killed by a signal (the OOM killer) said nothing itself, so
that one gets a line.
"""
from __future__ import annotations

import logging
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

FOUND_NONFINITE = 3  # a rank's nandoctor exits 3 once it printed its report


def main(argv: list[str]) -> int:
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_drop_housekeeping)
    try:
        run(parse_args(argv))
    except ChildFailedError as failure:
        return _exit_status(*failure.get_first_failure())
    except SignalException as stop:  # Ctrl-C or SIGTERM reached the launcher: the ranks were stopped
        return 128 + int(stop.sigval)
    return 0


def _exit_status(rank: int, failure) -> int:
    if failure.exitcode >= 0:
        return failure.exitcode or 1
    print(f"nandoctor: rank {rank} was killed by {failure.signal_name()} (pid {failure.pid}); "
          "it could not say why (out of memory is the usual cause)", file=sys.stderr)
    return 128 - failure.exitcode


def _drop_housekeeping(record: logging.LogRecord) -> bool:
    """Keep the agent's log but for what follows a rank's report: "failed (exitcode: 3)"
    and the SIGTERMs it sends the other ranks."""
    message = str(record.msg)
    if message.startswith("Sending process") and "closing signal" in message:
        return False
    return not (message.startswith("failed (exitcode") and record.args and record.args[0] == FOUND_NONFINITE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The words of a distributed run: who the culprit was, what the other ranks saw."""
from __future__ import annotations

from nandoctor.distributed import RankReport


# What a collective says when a peer process is gone (gloo, NCCL, the store).
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote worker crashing",
              "nccl communicator was aborted", "socket timeout", "connection refused")


def notes(dist: RankReport, error: dict | None = None) -> list[str]:
    """For the run's report: the culprit and whether the others were finite at that step;
    with no culprit, whether this rank's error was a peer that died."""
    if dist.culprit_rank is None:
        message = str((error or {}).get("message", "")).lower()
        if any(sign in message for sign in _PEER_GONE):
            return [f"rank {dist.rank}'s collective failed because another rank's process is gone (it died or "
                    "was killed, not stopped by nandoctor: no rank found a non-finite value); look at the "
                    "other ranks' output for why"]
        return []
    at = f" at step {dist.culprit_step}" if dist.culprit_step is not None else ""
    others = [r for r in range(dist.world_size) if r not in dist.ranks_nonfinite]
    head = f"rank {dist.culprit_rank} of {dist.world_size} found it first{at} (this report is rank {dist.rank}'s, on {dist.host})"
    if len(dist.ranks_nonfinite) == dist.world_size:
        return [f"{head}; every rank's own values went non-finite at that step: a numerical bug every rank "
                "hits, not one bad batch"]
    if others and dist.ranks_nonfinite:
        return [f"{head}; only rank{'s' if len(dist.ranks_nonfinite) > 1 else ''} "
                f"{_ranks(dist.ranks_nonfinite)} went non-finite on {'their' if len(dist.ranks_nonfinite) > 1 else 'its'} "
                f"own values; rank{'s' if len(others) > 1 else ''} {_ranks(others)} stayed finite until the "
                "gradients were averaged: that rank's data (its batch, its shard), not the model"]
    return [head]


def terminated(dist: RankReport) -> tuple[dict, list[str]]:
    """A rank stopped by a SIGTERM with no claim from any rank: the report's error and note."""
    error = {"type": "SIGTERM", "signal": "SIGTERM",
             "message": f"rank {dist.rank} was terminated (SIGTERM) while its script ran, before any of its "
                        "collectives failed"}
    note = ("the launcher stops every rank once one exits with an error or dies (torchrun sends SIGTERM): "
            "no rank found a non-finite value, so another rank's process most likely failed; look at the other "
            "ranks' output for why")
    return error, [note]


def stopped_line(dist: RankReport, run_report_path: str | None) -> str | None:
    """The one line a rank that is not the run's reporter prints (none for a clean run)."""
    where = f"; the report is at {run_report_path}" if run_report_path else ""
    if dist.culprit_rank is None:
        return None
    at = f" at step {dist.culprit_step}" if dist.culprit_step is not None else ""
    return f"rank {dist.rank}: stopped: rank {dist.culprit_rank} found a non-finite value{at}{where}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def stopped_reason(dist: RankReport) -> str:
    at = f" at step {dist.culprit_step}" if dist.culprit_step is not None else ""
    return f"stopped: rank {dist.culprit_rank} found a non-finite value{at}"

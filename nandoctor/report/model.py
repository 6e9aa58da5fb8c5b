"""The run report: plain data that the session assembles and renderers read.

This is the boundary of the architecture: nothing here imports torch, and `to_dict()` is
exactly the JSON of `shared/CONTRACT.md` (plus added fields, never fewer). The sites are
detection's typed `Site`s; every word in the report (the cause, the stop reason, notes)
comes from `nandoctor.diagnose`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nandoctor.distributed import RankReport
from nandoctor.detect.result import Discarded, History, Location, Site, SiteFacts

SCHEMA = "nandoctor.run/1"

__all__ = ["SCHEMA", "Cause", "Discarded", "History", "Location", "RunReport", "Site", "SiteFacts"]


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    explanation: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "explanation": self.explanation, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Cause | None":
        return cls(data["id"], data["title"], data["explanation"], data["fix"]) if data else None


@dataclass
class RunReport:
    status: str  # nonfinite | clean | script_error
    exit_code: int
    script: str
    step: int | None = None
    event: Site | None = None
    root: Site | None = None
    cause: Cause | None = None
    lineage: list[Site] = field(default_factory=list)
    # Added fields.
    reason: str = ""  # why the run stopped at the event, in words (JSON: `event.reason`)
    mode: str = "trace"
    history: History = field(default_factory=History)
    error: dict[str, Any] | None = None  # for script_error: the exception type and message
    notes: list[str] = field(default_factory=list)
    reproduced: bool | None = None  # watch mode: did the failure come back under trace?
    weights_clean: bool | None = None  # watch mode: stopped before a bad update was applied
    stopped_by: str | None = None  # e.g. "max_steps"
    # Non-finite values that were made and never mattered, by where they were born.
    discarded: list[Discarded] = field(default_factory=list)
    # Wall-clock seconds of the whole `nandoctor run` (a replay included); None when not timed.
    duration_s: float | None = None
    # Under torch.distributed: this rank, the culprit rank, the ranks that were non-finite.
    distributed: RankReport | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunReport":
        """Read back a report written by `to_dict` (watch mode reads its replay's report)."""
        lineage_sites = [Site.from_dict(dict(entry, inputs=[])) for entry in data.get("lineage") or []]
        event = data.get("event")
        return cls(
            status=data["status"], exit_code=data["exit_code"], script=data["script"], step=data.get("step"),
            event=Site.from_dict(event) if event else None,
            root=Site.from_dict(data["root"]) if data.get("root") else None,
            cause=Cause.from_dict(data.get("cause")), lineage=lineage_sites,
            reason=(event or {}).get("reason", ""), mode=data.get("mode", "trace"),
            history=History.from_dict(data.get("history")), error=data.get("error"),
            notes=list(data.get("notes") or []), reproduced=data.get("reproduced"),
            weights_clean=data.get("weights_clean"), stopped_by=data.get("stopped_by"),
            discarded=[Discarded.from_dict(d) for d in data.get("discarded") or []],
            duration_s=data.get("duration_s"), distributed=RankReport.from_dict(data.get("distributed")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "status": self.status,
            "exit_code": self.exit_code,
            "script": self.script,
            "step": self.step,
            "event": self._site_dict(self.event),
            "root": self._site_dict(self.root),
            "cause": self.cause.to_dict() if self.cause else None,
            "lineage": [site.lineage_entry() for site in self.lineage],
            "mode": self.mode,
            "history": self.history.to_dict(),
            "error": self.error,
            "notes": self.notes,
            "reproduced": self.reproduced,
            "weights_clean": self.weights_clean,
            "stopped_by": self.stopped_by,
            "discarded": [d.to_dict() for d in self.discarded],
            "duration_s": self.duration_s,
            **({"distributed": self.distributed.to_dict()} if self.distributed is not None else {}),
        }

    def _site_dict(self, site: Site | None) -> dict[str, Any] | None:
        if site is None:
            return None
        return dict(site.to_dict(), reason=self.reason if site == self.event else "")

"""The run report: plain data that detection fills in and renderers read.

This is the boundary of the architecture: nothing here imports torch, and `to_dict()` is
exactly the JSON of `shared/CONTRACT.md` (plus added fields, never fewer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nandoctor.stats import TensorSummary

SCHEMA = "nandoctor.run/1"

PHASES = ("forward", "backward", "optimizer", "data", "init")


@dataclass(frozen=True)
class Location:
    """The source line a user should look at."""

    file: str
    line: int
    function: str
    code: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Location | None":
        return cls(data["file"], data["line"], data["function"], data["code"]) if data else None


@dataclass
class OpSite:
    """One op whose output was non-finite: where it ran and what went in and out."""

    op: str
    phase: str
    location: Location | None
    module: str | None = None
    backward_node: str | None = None
    output: TensorSummary | None = None
    inputs: list[TensorSummary] = field(default_factory=list)
    step: int | None = None
    # Added fields (beyond the contract): why the detector stopped here, and a few raw
    # facts rules found useful (e.g. the CTC lengths), kept for the report.
    reason: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "op": self.op,
            "location": self.location.to_dict() if self.location else None,
            "backward_node": self.backward_node,
            "module": self.module,
            "output": self.output.to_dict() if self.output else None,
            "inputs": [s.to_dict() for s in self.inputs],
            "step": self.step,
            "reason": self.reason,
            "facts": self.facts,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OpSite":
        return cls(
            op=data["op"], phase=data["phase"], location=Location.from_dict(data.get("location")),
            module=data.get("module"), backward_node=data.get("backward_node"),
            output=TensorSummary.from_dict(data["output"]) if data.get("output") else None,
            inputs=[TensorSummary.from_dict(s) for s in data.get("inputs") or []],
            step=data.get("step"), reason=data.get("reason", ""), facts=dict(data.get("facts") or {}),
        )

    def lineage_entry(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "phase": self.phase,
            "location": self.location.to_dict() if self.location else None,
            "backward_node": self.backward_node,
            "module": self.module,
            "output": self.output.to_dict() if self.output else None,
        }


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
class History:
    """Per-step loss and global gradient norm, oldest first (None where not seen)."""

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "loss": self.loss, "grad_norm": self.grad_norm}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "History":
        data = data or {}

        def number(v):  # JSON carries non-finite floats as strings
            return float(v) if isinstance(v, str) else v

        return cls(list(data.get("steps", [])), [number(v) for v in data.get("loss", [])],
                   [number(v) for v in data.get("grad_norm", [])])


@dataclass
class RunReport:
    status: str  # nonfinite | clean | script_error
    exit_code: int
    script: str
    step: int | None = None
    event: OpSite | None = None
    root: OpSite | None = None
    cause: Cause | None = None
    lineage: list[OpSite] = field(default_factory=list)
    # Added fields.
    mode: str = "trace"
    history: History = field(default_factory=History)
    error: dict[str, Any] | None = None  # for script_error: the exception type and message
    notes: list[str] = field(default_factory=list)
    reproduced: bool | None = None  # watch mode: did the failure come back under trace?
    weights_clean: bool | None = None  # watch mode: stopped before a bad update was applied
    stopped_by: str | None = None  # e.g. "max_steps"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunReport":
        """Read back a report written by `to_dict` (watch mode reads its replay's report)."""
        lineage_sites = [OpSite.from_dict(dict(entry, inputs=[])) for entry in data.get("lineage") or []]
        return cls(
            status=data["status"], exit_code=data["exit_code"], script=data["script"], step=data.get("step"),
            event=OpSite.from_dict(data["event"]) if data.get("event") else None,
            root=OpSite.from_dict(data["root"]) if data.get("root") else None,
            cause=Cause.from_dict(data.get("cause")), lineage=lineage_sites, mode=data.get("mode", "trace"),
            history=History.from_dict(data.get("history")), error=data.get("error"),
            notes=list(data.get("notes") or []), reproduced=data.get("reproduced"),
            weights_clean=data.get("weights_clean"), stopped_by=data.get("stopped_by"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "status": self.status,
            "exit_code": self.exit_code,
            "script": self.script,
            "step": self.step,
            "event": self.event.to_dict() if self.event else None,
            "root": self.root.to_dict() if self.root else None,
            "cause": self.cause.to_dict() if self.cause else None,
            "lineage": [site.lineage_entry() for site in self.lineage],
            "mode": self.mode,
            "history": self.history.to_dict(),
            "error": self.error,
            "notes": self.notes,
            "reproduced": self.reproduced,
            "weights_clean": self.weights_clean,
            "stopped_by": self.stopped_by,
        }

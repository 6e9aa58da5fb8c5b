"""Per-op finiteness flags kept on the device and read at step boundaries.

On a GPU, reading any result on the host (`.item()`) waits for every queued kernel: a
per-op check that reads its answer turns an asynchronous training step into one sync per
op. Instead, for each checked op on an accelerator, one reduction (`aminmax`, a single
pass) is queued on the op's own stream and its two 0-d results are kept on the device.
The host reads them all at once at the next boundary (the loss reaching `backward()`,
`backward()` returning, `optimizer.step()`), in one transfer, and goes back from there to
the first op whose flag is non-finite.

Min and max together are exact where a sum is not: NaN propagates through both (a NaN
anywhere gives NaN), an Inf shows as ±Inf, and finite values never overflow — so a flag
says which ops made a NaN and which only an Inf, which the detector's policy needs.

What is lost is the op's inputs and its output: by the boundary they have been freed or
overwritten. The first flagged op is known (its name, phase, line, module) and a seeded
replay of the script that checks every op at once recovers the rest (see `replay.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

from nandoctor.detect.ops import op_name
from nandoctor.detect.policy import op_verdict
from nandoctor.detect.records import Record, next_order
from nandoctor.detect.result import SiteFacts

# Flags kept before a read is forced (a long inference loop never reaches a boundary):
# two 0-d tensors per op, a few MB of device memory at most.
PENDING_LIMIT = 8192


def to_host(values: torch.Tensor) -> torch.Tensor:
    """The one place a boundary's numbers cross to the host: a sync on an accelerator."""
    return values.to("cpu")


class HostRead:
    """Numbers a boundary needs on the host (a step's flags, losses and gradient norm),
    queued on their devices and read together: with `one_transfer` (flags on, as on a GPU)
    one transfer, so one host sync, per device, queued as float64, which holds a float32
    or float64 value exactly; without (the CPU, where a read is no sync) each value read on
    its own, which takes fewer calls than joining them."""

    def __init__(self, one_transfer: bool = True) -> None:
        self.one_transfer = one_transfer
        self._queued: list[torch.Tensor] = []

    def add(self, values: torch.Tensor) -> int:
        """Queue `values` (any shape); returns its place in what `read` gives."""
        self._queued.append(values.detach().reshape(-1).to(torch.float64) if self.one_transfer else values)
        return len(self._queued) - 1

    def read(self) -> list:
        """What was queued, on the host (each a sequence of numbers), in the order added."""
        queued = self._queued
        if not self.one_transfer:
            return [[v.item()] if v.dim() == 0 else v.detach().reshape(-1).tolist() for v in queued]
        devices = {values.device for values in queued}
        if len(devices) > 1:  # (model parallel: one transfer per device)
            host: list = [np.empty(0)] * len(queued)
            for device in devices:
                indices = [i for i, values in enumerate(queued) if values.device == device]
                for i, values in zip(indices, _together([queued[i] for i in indices])):
                    host[i] = values
            return host
        return _together(queued) if queued else []


def _together(queued: list[torch.Tensor]) -> list[np.ndarray]:
    """Tensors of one device on the host, in one transfer, split back as they were."""
    together = to_host(torch.cat(queued) if len(queued) > 1 else queued[0]).numpy()
    host, start = [], 0
    for values in queued:
        host.append(together[start:start + len(values)])
        start += len(values)
    return host


class FlaggedOp(NamedTuple):
    """What the hot path keeps about one deferred op: enough to name it, nothing heavy
    (no tensors, no autograd node: holding a node would keep its saved tensors alive)."""

    func: object  # the ATen op overload (long-lived, so cheap to keep), or a module region's name
    phase: str
    dtype: torch.dtype | None
    node_seq: int | None  # the backward node running it, or the node a forward op created
    node_name: str | None
    where: tuple | None  # (code, line), looked up only when no node site will name it
    module: str | None
    step: int | None


@dataclass(frozen=True)
class Flagged:
    """An op whose flag was non-finite when the flags were read."""

    entry: FlaggedOp
    has_nan: bool


class DeviceFlags:
    """The flags of the ops run since the last read, in the order the ops ran."""

    def __init__(self, setting: str = "auto") -> None:
        self.defer_cpu = setting == "always"  # CPU has no sync to save; tests use it to exercise this path
        # Off unless some tensor can live on an accelerator: a CPU-only run's hot path then
        # pays one attribute test per op for this feature.
        self.enabled = self.defer_cpu or (setting == "auto" and _accelerator_present())
        self._entries: list[FlaggedOp] = []
        # Per device (a stack needs one): the flag tensors and the entry each pair belongs to.
        self._values: dict[torch.device, list[torch.Tensor]] = {}
        self._owners: dict[torch.device, list[int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def wants(self, t: torch.Tensor) -> bool:
        """Check this op's output by a flag (instead of reading it on the host now)?"""
        # Only plain tensors with values: meta and fake tensors (subclasses) have none to flag.
        return self.enabled and type(t) is torch.Tensor and not t.is_meta and (self.defer_cpu or not t.is_cpu)

    def covers(self, t: torch.Tensor) -> bool:
        """Is `t` (a parameter too) where values are checked by flags rather than read?"""
        return self.enabled and not t.is_meta and (self.defer_cpu or not t.is_cpu)

    def add(self, t: torch.Tensor, entry: FlaggedOp) -> bool:
        """Queue the flag of `t`; True when enough are pending that they should be read."""
        device = t.device
        values = self._values.get(device)
        if values is None:
            values = self._values[device] = []
            self._owners[device] = []
        values += torch.aminmax(t)
        self._owners[device].append(len(self._entries))
        self._entries.append(entry)
        return len(self._entries) >= PENDING_LIMIT

    def read(self) -> list[Flagged]:
        """The non-finite flags since the last read, in op order: one host read per device."""
        if not self._entries:
            return []
        transfer = HostRead()
        flagged = self.take(transfer)
        return flagged(transfer.read())

    def take(self, transfer: HostRead) -> Callable[[list[np.ndarray]], list[Flagged]]:
        """Queue the flags since the last read on `transfer` (one code per op: 0 finite, 1
        an Inf, 2 a NaN); the function returned gives the flagged ops, in op order, from
        what the transfer read."""
        entries, owners = self._entries, self._owners
        queued = []
        for device, tensors in self._values.items():
            pairs = torch.stack(tensors).view(-1, 2)  # one row per op: (min, max)
            codes = (~torch.isfinite(pairs).all(dim=1)).to(torch.uint8) + torch.isnan(pairs).any(dim=1)
            queued.append((transfer.add(codes), owners[device]))
        self._entries, self._values, self._owners = [], {}, {}

        def flagged(host: list[np.ndarray]) -> list[Flagged]:
            found = [(owner[row], bool(host[place][row] == 2))
                     for place, owner in queued for row in np.flatnonzero(host[place])]
            return [Flagged(entries[index], nan) for index, nan in sorted(found)]

        return flagged


def _accelerator_present() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


_A_GRADIENT = FlaggedOp("a backward node's output", "backward", None, None, None, None, None, None)


class DeferredOps:
    """The detector's side of device flags: queue an op's flag with what names it later,
    read them at a boundary and apply the same policy as a per-op check (policy.py), but
    for `stop_on_inf_dtypes`. Every flagged op outside backward is counted as made (flags
    cannot tell a value's birth from the ops it flowed through). For the same reason an Inf
    in float16 is a suspect here, not a stop: a flag cannot tell an overflow from a -inf
    mask passed on (`scores + mask`, a LogSoftmax over masked logits), which per-op
    tracing follows by its record. An overflow that matters stops the run where it reaches
    the loss or a gradient, and the replay, checking each op at once, applies the policy."""

    SUSPECTS_KEPT = 16

    def __init__(self, flags: DeviceFlags, recorder) -> None:
        self.flags = flags
        self.recorder = recorder
        self.were_read = False  # some boundary read flags: this run keeps no lineage for them
        self.suspects: list = []  # records of this step's flagged suspects (the candidates)

    def defer(self, func, args, out: torch.Tensor, node, created_seq) -> bool:
        """Queue a device-side flag for `out` (no sync now); True when it is time to read."""
        r = self.recorder
        if node is not None:
            seq, node_name, where, module = node._sequence_nr(), type(node).__name__, None, None
        else:
            seq, node_name, module = created_seq, None, r.modules.current
            # An op that built an autograd node has its line in the node sites already.
            where = None if created_seq is not None else r.locator.user_frame(2)
        entry = FlaggedOp(func, r.phase(node, args), out.dtype, seq, node_name, where, module, r.state.step_or_none)
        return self.flags.add(out, entry)

    def defer_named(self, name: str, t: torch.Tensor, phase: str, where, module) -> bool:
        """Queue the flag of what more than one op made (a module region's output, the
        parameters after a step), named by `name`, with its user line and module; True
        when it is time to read."""
        entry = FlaggedOp(name, phase, t.dtype, None, None, where, module, self.recorder.state.step_or_none)
        return self.flags.add(t, entry)

    def defer_gradient(self, t: torch.Tensor) -> bool:
        """Queue the flag of a gradient a backward node gave. What a backward flag tells
        is only that backward made a non-finite value (see `read`): the step's check of
        the gradients stops the run, and the replay names the op. So it carries no name."""
        return self.flags.add(t, _A_GRADIENT)

    def read(self):
        """(record, reason) of the first flagged op that stops the run, or None."""
        return self.verdict(self.flags.read())

    def take(self, transfer: HostRead):
        """The flags queued on `transfer`; the function returned gives `read`'s answer from
        what the transfer read."""
        flagged = self.flags.take(transfer)
        return lambda host: self.verdict(flagged(host))

    def verdict(self, flags: list[Flagged]):
        """(record, reason) of the first of these flagged ops that stops the run, or None;
        the others are counted as made, and the first few kept as suspects."""
        self.were_read = True
        for flag in flags:
            if flag.entry.phase == "backward":
                self.recorder.last_backward_order = next_order()
                continue
            record = self._record(flag)
            reason = op_verdict(record.phase, flag.has_nan, not flag.has_nan, flag.entry.dtype)
            if reason is not None:
                return record, reason
            self.recorder.count_made(record)
            if len(self.suspects) < self.SUSPECTS_KEPT:
                self.suspects.append(record)
        return None

    def _record(self, flag: Flagged):
        """A record of a flagged op: its name, phase, line and module, but not its values
        (freed by now); a seeded replay that checks each op at once recovers those."""
        e = flag.entry
        site = self.recorder.sites.get(e.node_seq) if e.node_seq is not None else None
        return Record(
            op=op_name(e.func), phase=e.phase, where=e.where or (site[0] if site else None),
            module=e.module or (site[1] if site else None), backward_node=e.node_name, node_seq=e.node_seq,
            step=e.step, output=None, inputs=[], parents=[], has_nan=flag.has_nan,
            facts=SiteFacts(device_flag="nan" if flag.has_nan else "inf"),
        )

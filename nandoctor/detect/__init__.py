"""Detection: watch a running script and stop at the first non-finite value that matters.

It produces typed data only (`result.py`: `Detection`, `Site`, `SiteFacts`, `WatchFinding`);
every word about it is written by `nandoctor.diagnose`.

- `observer`: the protocol the training hooks call; `Detector` (trace) and `StepWatcher`
  (watch) implement it.
- `detector`: trace mode, wiring the pieces below; `watch`: watch mode.
- `mode`: the TorchDispatchMode that runs each op and checks its output (the hot path).
- `ops`: which ops are worth checking at all; `op_facts`: op-specific facts (CTC lengths).
- `policy`: when a non-finite op output stops the run and when it is a suspect.
- `recorder` / `records`: what was learnt about each non-finite tensor; `lineage`: the root.
- `boundaries`: loss, gradients, optimizer step; `batches`: DataLoader batches.
- `device_flags`: per-op flags kept on an accelerator, read at boundaries.
- `provenance`: op -> user's source line and module; backward node -> forward line.
- `state`: step count, phase, history; `hooks`: where training shows itself.
"""

"""Detection: watch every ATen op of a running script and stop at the first non-finite value.

- `detector.Detector`: the public context manager; owns the state and decides when to stop.
- `mode`: the private TorchDispatchMode that runs each op and checks its output (hot path).
- `ops`: which ops are worth checking at all.
- `provenance`: op -> user's source line and module; backward node -> forward line.
- `records`: what was learnt about each non-finite tensor, for the root and the lineage.
- `hooks`: the points where training shows itself (backward, optimizer step, DataLoader).
"""

"""From the record where the run stopped back to its root: the `Detection`.

The root is the earliest non-finite ancestor: follow each record's non-finite inputs
(parents), skipping values written on purpose (a `-inf` mask), to a record whose inputs
were all finite. A backward root whose own forward op already made an Inf (divide first,
mask afterwards) goes one step further back, to that forward op.
"""
from __future__ import annotations

import copy

from nandoctor.detect.ops import normalises_rows
from nandoctor.detect.provenance import SourceLocator
from nandoctor.detect.records import Record
from nandoctor.detect.result import Detection, Site, StopReason


def explain(event: Record, reason: StopReason, forward_by_node: dict[int, Record], locator: SourceLocator,
            needs_replay: bool = False, flagged_suspects: list[Record] = (), refused_by: str | None = None,
            forward_by_line: dict[tuple, Record] | None = None, hidden_by: str | None = None) -> Detection:
    chain = _ancestry(event, forward_by_node, forward_by_line or {})
    _update_work(chain)
    root = chain[-1]
    intended = next((p for p in root.parents if p.intended or _legit_for(root, p)), None)
    if intended is not None and birth_of(intended).facts.mask_overflowed and not normalises_rows(root.op):
        # A finite mask (finfo.min, -1e9) an op pushed past the range went on to make this
        # NaN (0 * -inf in an entropy): no one wrote that -inf, the op that overflowed made
        # it, and it is the root. (A softmax over a row the mask leaves nothing in is NaN
        # whatever the mask's value: the empty row is the bug, at the softmax.)
        root = birth_of(intended)
        chain.append(root)
        intended = None
    if intended is not None:
        intended = birth_of(intended)
        # The root consumed an Inf written on purpose (a -inf mask) or a forward -inf that
        # was fine where it was made (log-space): say where it was.
        root.facts.inf_written_at = locator.location(intended.where)
        root.facts.inf_written_by = None if root.facts.inf_written_at else intended.op
    chain.reverse()
    sites = [site_of(r, locator) for r in chain]
    # (A value made out of the checks' sight: by the optimizer, behind a device flag, in a
    # backward node left to the step's check. The replay checks each of those ops.)
    needs_replay = needs_replay or root.facts.written_by_optimizer or root.facts.device_flag is not None \
        or root.facts.made_out_of_sight
    return Detection(reason=reason, event=sites[-1], root=sites[0], lineage=sites, needs_replay=needs_replay,
                     flagged_suspects=[site_of(r, locator) for r in flagged_suspects], refused_by=refused_by,
                     hidden_by=hidden_by)


def _ancestry(event: Record, forward_by_node: dict[int, Record], forward_by_line: dict[tuple, Record]
              ) -> list[Record]:
    """The event first, then the parents on the way to its root, down to the root."""
    chain = _path_to_earliest(event, _counts_for)
    root = chain[-1]
    made_upstream = forward_by_line.get(root.where) if root.where is not None else None
    if root.phase == "backward" and root.facts.untracked_input and not root.parents \
            and made_upstream is not None and made_upstream.step == root.step:
        # Its input was non-finite before it ran, made where no op was recorded (inside a
        # torch.nn region, whose graph the run kept): it came from its forward line's values.
        root.facts.untracked_input = False
        return chain + _path_to_earliest(made_upstream, _counts_for)
    if root.phase == "backward" and root.node_seq is not None:
        forward = forward_by_node.get(root.node_seq)
        # Only a forward op that made its Inf from finite inputs: one that passed on a -inf
        # written on purpose (a mask) is legit, and the backward formula is the root.
        if forward is not None and not forward.parents:
            forward.facts.gradient_leak_through = root.backward_node
            chain.append(forward)
        elif forward is not None:
            # Its forward op took an Inf made earlier in forward that a mask dropped after
            # (`where(valid, -p * torch.log(p), 0)`: log(0) into a product): backward still
            # multiplies by it, so the leak's root is where that Inf was made. That is the
            # forward op itself when it made a NaN of a -inf written on purpose and the
            # NaN was dropped (`where(legal, p * log_softmax(masked), 0)`: 0 * -inf).
            # (Or an op made finite values of it: exp(w * log(0)) is exp(-inf) = 0.)
            made = _path_to_earliest(forward, lambda child, parent: not parent.intended)
            born = made[-1]
            if (born.facts.masked or born.facts.absorbed) and born.phase != "backward":
                born.facts.gradient_leak_through = root.backward_node
                chain.extend(made)
    elif root.phase != "backward" and root.facts.masked:
        # Made in forward, dropped there (so the loss stayed finite), yet backward ran
        # through it: the first backward op on the way turned it into a NaN gradient.
        node = next((r.backward_node for r in reversed(chain) if r.phase == "backward"), None)
        root.facts.gradient_leak_through = node
    return chain


def _update_work(chain: list[Record]) -> None:
    """What the script computes on its way to a gradient or a weight it writes by hand is
    part of that work, in that phase: the scalars of a hand-written gradient normalisation
    (`p.grad.mul_(1 / p.grad.norm())`: the reciprocal) are backward; the step of SAM's
    perturbation (`p.add_(rho * p.grad / p.grad.norm())`: the division) or of an SGD by hand
    is the optimizer's. An op feeding such work is one of them when it built no graph, ran
    outside any module and in the same step."""
    work = None  # the phase of the hand-written work the values below feed, if any
    if chain[0].phase == "init" and chain[0].facts.writes_parameter:
        _initial_weights_computed(chain)
        return
    for child, parent in zip(chain, chain[1:]):  # (the event first: each parent after its child)
        if child.phase in ("backward", "optimizer") and child.op and child.backward_node is None:
            work = work or child.phase
        if not (work and parent.phase == "forward" and parent.module is None
                and parent.node_seq is None and parent.step == child.step):
            work = None
            continue
        parent.phase = work
        parent.facts.own_optimizer = work == "optimizer"


def _initial_weights_computed(chain: list[Record]) -> None:
    """Weights initialised from data before training (prototypes as a classifier's rows,
    a bias from the label frequencies, k-means centroids as a codebook): the values the
    script computed on its way to the parameter it wrote are the model's initialisation,
    init, not data prepared for training. Not a batch a DataLoader served."""
    for parent in chain[1:]:
        if parent.phase != "data" or parent.facts.batch is not None or parent.node_seq is not None:
            return
        parent.phase = "init"


def birth_of(record: Record) -> Record:
    """The earliest non-finite ancestor of `record` (itself when it was born there)."""
    return _path_to_earliest(record, lambda child, parent: not parent.intended)[-1]


def _counts_for(child: Record, parent: Record) -> bool:
    """Is `parent` a cause of `child` for the lineage (not a value written on purpose)?"""
    return not parent.intended and not _legit_for(child, parent)


def _path_to_earliest(start: Record, counts) -> list[Record]:
    """`start`, then parents down to its earliest ancestor: the one made first of all the
    non-finite values it descends from (through parents that `counts`).

    Not the earliest parent at each step: a NaN loss that adds a NaN reconstruction error
    (from an exp that overflowed early in the forward) to an Inf penalty (from an exp on
    the loss's own line) has the penalty as its earlier parent, but its root is the first
    exp. Where several paths lead there, each step takes the earliest parent on one."""
    ancestors: dict[int, Record] = {id(start): start}
    stack = [start]
    while stack:
        child = stack.pop()
        for parent in child.parents:
            if id(parent) not in ancestors and counts(child, parent):
                ancestors[id(parent)] = parent
                stack.append(parent)
    root = min(ancestors.values(), key=lambda r: r.order)
    reaches_root = _reaching(root, ancestors, counts)
    chain = [start]
    while chain[-1] is not root:
        child = chain[-1]
        on_the_way = [p for p in child.parents if id(p) in reaches_root and counts(child, p) and p not in chain]
        if not on_the_way:  # (only if a record were ever its own ancestor)
            break
        chain.append(min(on_the_way, key=lambda r: r.order))
    return chain


def _reaching(root: Record, ancestors: dict[int, Record], counts) -> set[int]:
    """The ids of the records in `ancestors` that `root` is an ancestor of (itself included)."""
    reaching = {id(root)}
    changed = True
    ordered = sorted(ancestors.values(), key=lambda r: r.order)  # parents come before children
    while changed:  # (one pass suffices in birth order; the loop guards against odd orders)
        changed = False
        for r in ordered:
            if id(r) not in reaching and any(id(p) in reaching and counts(r, p) for p in r.parents):
                reaching.add(id(r))
                changed = True
    return reaching


def _legit_for(child: Record, parent: Record) -> bool:
    """A forward -inf (and nothing worse: log(0) of a mask, a log-probability) is a legit
    value; when a built-in backward formula turns it into NaN (LogsumexpBackward over an
    all -inf row), that formula is the root, not the -inf."""
    out = parent.output
    return (child.phase == "backward" and not child.facts.user_backward and child.has_nan
            and parent.phase != "backward" and out is not None
            and out.neginf > 0 and out.nan == 0 and out.posinf == 0)


def site_of(r: Record, locator: SourceLocator) -> Site:
    return Site(op=r.op, phase=r.phase, location=locator.location(r.where), module=r.module,
                backward_node=r.backward_node, output=r.output, inputs=list(r.inputs), step=r.step,
                facts=copy.copy(r.facts))

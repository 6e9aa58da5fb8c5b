"""Multi-process training (torchrun, DDP): every rank is watched, the culprit rank is named,
the other ranks stop cleanly, and nothing waits forever.

Each rank runs its own `nandoctor run` (torchrun starts N of them). They talk through the
key-value store torch.distributed already has: torchrun's agent store, or the TCPStore
rank 0 hosts for an `env://` launch (MASTER_ADDR:MASTER_PORT). nandoctor adds nothing per
step: no collective, no store request, no host sync. Only when a rank stops:

- a rank whose *own* values went non-finite (its loss, its data, an op it ran; not
  gradients that arrived averaged from the others) claims the run with one
  `compare_set`: the first claim names the culprit rank;
- every rank publishes how it ended (one key per rank), so the culprit's report says which
  ranks were non-finite at that step (one rank's bad batch, or a bug every rank hits). A
  rank that hears of the claim says at once how far it has run; when the culprit's value
  went non-finite in a forward this rank has not run yet, it runs that forward first (see
  Observer.check_peers), and the culprit waits for that word;
- a background thread on each rank waits on the culprit key (one blocking request held
  open, not a poll), so a rank that is still training stops at its next step boundary
  ("stopped: rank 1 found a non-finite value at step 3") instead of running on, or waiting
  in a collective for a peer that is gone until the backend's timeout.

Every wait has a timeout; a rank that cannot reach the store at all reports on its own.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

# How long a rank waits for the others when it stops: for the culprit's claim (a peer that
# died), for the other ranks' status (which ranks were non-finite), for the replay's port.
PEER_WAIT_S = 5.0
SETTLE_POLL_S = 0.02
STORE_CONNECT_S = 10.0
# A replay's ranks run on their own rendezvous: without torchrun's agent store (rank 0's
# replay hosts a new TCPStore on the fresh port), so nothing of the first launch is joined.
_LAUNCH_STORE_VARIABLES = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")
# How long a distributed replay may run before it is given up (a rank that hangs in a
# collective must not hang the launch).
REPLAY_TIMEOUT_S = 600
# How long a rank stopped by a peer waits to hear whether the culprit replays: the culprit
# first waits up to PEER_WAIT_S for the ranks' word, then decides at once.
REPLAY_JOIN_WAIT_S = 30.0
_NO_REPLAY = "none"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    host: str

    @classmethod
    def from_env(cls, environ=os.environ) -> "RankInfo | None":
        """This process's place in a torch.distributed launch; None when it is not one."""
        try:
            rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        except (KeyError, ValueError):
            return None
        if world_size < 2:
            return None
        return cls(rank, int(environ.get("LOCAL_RANK", rank)), world_size, socket.gethostname())


@dataclass(frozen=True)
class RankReport:
    """The distributed part of a rank's report (the contract's `distributed` field)."""

    world_size: int
    rank: int
    local_rank: int
    host: str
    culprit_rank: int | None
    ranks_nonfinite: list[int]
    culprit_step: int | None = None
    stopped_by_peer: bool = False  # this rank was stopped because another one found it
    # With no culprit: the rank whose script failed first (its own error, before a peer's
    # collective failed because that rank's process was gone).
    failed_first_rank: int | None = None

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                "culprit_rank": self.culprit_rank, "ranks_nonfinite": list(self.ranks_nonfinite),
                "culprit_step": self.culprit_step, "stopped_by_peer": self.stopped_by_peer,
                "failed_first_rank": self.failed_first_rank}

    @classmethod
    def from_dict(cls, data: dict | None) -> "RankReport | None":
        if not data:
            return None
        return cls(data["world_size"], data["rank"], data.get("local_rank", data["rank"]), data.get("host", ""),
                   data.get("culprit_rank"), list(data.get("ranks_nonfinite") or []), data.get("culprit_step"),
                   bool(data.get("stopped_by_peer")), data.get("failed_first_rank"))

    @property
    def is_culprit(self) -> bool:
        return self.culprit_rank == self.rank

    @property
    def writes_run_report(self) -> bool:
        """The run's one report is the culprit's; with no culprit, that of the rank whose
        script failed first, else rank 0's."""
        if self.culprit_rank is not None:
            return self.is_culprit
        return self.rank == (self.failed_first_rank if self.failed_first_rank is not None else 0)


@dataclass(frozen=True)
class Claim:
    """The culprit's claim on the run: its rank, its step, and the phase of that step where
    its value went non-finite (data, forward, backward, optimizer; None when unknown)."""

    rank: int
    step: int | None
    phase: str | None = None

    def to_json(self) -> str:
        return json.dumps({"rank": self.rank, "step": self.step, "phase": self.phase})

    @classmethod
    def from_json(cls, text: bytes | str) -> "Claim":
        data = json.loads(text)
        return cls(int(data["rank"]), data.get("step"), data.get("phase"))

    def covered_by(self, status: dict) -> bool:
        """Does a rank's status say all it will about this claim's step? A final one does;
        one sent while that rank was still running on does when it had run the step's
        forward already, or will not run it (the claim was not a forward's)."""
        if status.get("final", True):
            return True
        forwards = status.get("forwards")
        return self.phase != "forward" or self.step is None or forwards is None or forwards > self.step


class PeerChannel:
    """This rank's line to the others, through the launch's store (see the module docstring)."""

    def __init__(self, info: RankInfo, environ=os.environ) -> None:
        self.info = info
        self._address = (environ.get("MASTER_ADDR", "127.0.0.1"), int(environ.get("MASTER_PORT", "0") or 0))
        run = environ.get("TORCHELASTIC_RUN_ID") or f"port{self._address[1]}"
        self._prefix = f"nandoctor/{run}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self._store = None
        self._unreachable = False
        self._stop_watching = threading.Event()
        self.seen_claim = False  # another rank's claim arrived (or this rank claimed)
        self._publishing = threading.Lock()
        self._published_final = False

    # -- the store ---------------------------------------------------------------------

    def _connect(self, timeout_s: float = STORE_CONNECT_S):
        import torch.distributed as dist

        host, port = self._address
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    def store(self):
        """The store, connected on first use; None when it cannot be reached."""
        if self._store is None and not self._unreachable and self._address[1]:
            try:
                self._store = self._connect()
            except Exception:  # noqa: BLE001 - no store: this rank reports on its own
                self._unreachable = True
        return self._store

    def _key(self, name: str) -> str:
        return self._prefix + name

    # -- what a stopping rank says -----------------------------------------------------

    def claim(self, step: int | None, phase: str | None = None) -> Claim:
        """Claim the run as its culprit; returns the claim that won (maybe another rank's)."""
        mine = Claim(self.info.rank, step, phase)
        self.seen_claim = True
        store = self.store()
        if store is None:
            return mine
        try:
            won = store.compare_set(self._key("culprit"), "", mine.to_json())
            return Claim.from_json(won)
        except Exception:  # noqa: BLE001
            return mine

    def culprit(self, wait_s: float = PEER_WAIT_S) -> Claim | None:
        """The culprit's claim, waiting up to `wait_s` for one; None when no rank claimed."""
        store = self.store()
        if store is None:
            return None
        try:
            if not _wait(store, [self._key("culprit")], wait_s):
                return None
            return Claim.from_json(store.get(self._key("culprit")))
        except Exception:  # noqa: BLE001 - the store is gone
            return None

    def publish(self, status: dict, final: bool = True) -> None:
        """How this rank ended: {"own_nonfinite": bool, "step": ...}. A provisional status
        (`final=False`, sent from the listening thread, with "forwards": how far the rank had
        run) never replaces the final one."""
        with self._publishing:
            if self._published_final or self.store() is None:
                return
            self._published_final = final
            try:
                self._store.set(self._key(f"rank/{self.info.rank}"), json.dumps({**status, "final": final}))
            except Exception:  # noqa: BLE001
                pass

    def statuses(self, wait_s: float = PEER_WAIT_S, settled: Callable[[dict], bool] = lambda status: True,
                 ) -> dict[int, dict]:
        """Every rank's published status, waiting up to `wait_s` in all for the missing ones
        and for those not yet `settled` (a rank still running on to the culprit's step)."""
        store = self.store()
        if store is None:
            return {}
        deadline = time.monotonic() + wait_s
        keys = [self._key(f"rank/{r}") for r in range(self.info.world_size)]
        _wait(store, keys, wait_s)  # some rank may never say: report what is there
        found = self._read(store, keys)
        while not all(settled(status) for status in found.values()) and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_S)  # only while a stopping rank waits for its peers' word
            found = self._read(store, keys)
        return found

    @staticmethod
    def _read(store, keys: list[str]) -> dict[int, dict]:
        found: dict[int, dict] = {}
        for rank, key in enumerate(keys):
            try:
                if store.check([key]):
                    found[rank] = json.loads(store.get(key))
            except Exception:  # noqa: BLE001
                break
        return found

    def decide(self, name: str, value: str) -> str | None:
        """Set `name` to `value` unless a rank set it first; returns what it holds (None
        without a store)."""
        store = self.store()
        if store is None:
            return None
        try:
            return store.compare_set(self._key(name), "", value).decode()
        except Exception:  # noqa: BLE001
            return None

    def read(self, name: str, wait_s: float) -> str | None:
        """What `name` holds, waiting up to `wait_s` for a rank to set it; None if none did."""
        store = self.store()
        if store is None:
            return None
        try:
            return store.get(self._key(name)).decode() if _wait(store, [self._key(name)], wait_s) else None
        except Exception:  # noqa: BLE001
            return None

    def share(self, name: str, value: str | None, wait_s: float = 30.0) -> str | None:
        """Rank 0 sets `name` to `value`; every rank returns it (None if it never came)."""
        store = self.store()
        if store is None:
            return value if self.info.rank == 0 else None
        if self.info.rank == 0 and value is not None:
            try:
                store.set(self._key(name), value)
            except Exception:  # noqa: BLE001
                return None
        return self.read(name, wait_s)  # (polled: a late rank 0 is no c10d timeout warning)

    # -- listening for the culprit while training runs ------------------------------------

    def watch(self, on_claim: Callable[[Claim], None]) -> None:
        """Call `on_claim` (from a background thread) when another rank claims the run."""
        thread = threading.Thread(target=self._watch, args=(on_claim,), name="nandoctor-peers", daemon=True)
        thread.start()

    def _watch(self, on_claim: Callable[[Claim], None]) -> None:
        try:
            store = self._connect()  # its own connection: a blocking wait holds it
        except Exception:  # noqa: BLE001
            return
        key = self._key("culprit")
        while not self._stop_watching.is_set():
            try:
                store.wait([key], timedelta(seconds=60))
            except Exception:  # noqa: BLE001 - timed out (wait again) or the store is gone
                if not _alive(store):
                    return
                continue
            try:
                claim = Claim.from_json(store.get(key))
            except Exception:  # noqa: BLE001
                return
            if claim.rank != self.info.rank and not self._stop_watching.is_set():
                self.seen_claim = True
                on_claim(claim)
            return

    def tell_replay(self, own: bool, wait_s: float = PEER_WAIT_S) -> dict[int, bool]:
        """After the run's replay: say whether this rank's replay saw its own values go
        non-finite, and hear every rank's word (waiting up to `wait_s` for them)."""
        store = self.store()
        if store is None:
            return {self.info.rank: own}
        keys = [self._key(f"replay_own/{r}") for r in range(self.info.world_size)]
        try:
            store.set(keys[self.info.rank], "1" if own else "0")
            _wait(store, keys, wait_s)
        except Exception:  # noqa: BLE001 - the store is gone: this rank's word only
            return {self.info.rank: own}
        said: dict[int, bool] = {}
        for rank, key in enumerate(keys):
            try:
                if store.check([key]):
                    said[rank] = store.get(key).decode() == "1"
            except Exception:  # noqa: BLE001
                break
        return said

    def close(self) -> None:
        self._stop_watching.set()


def _wait(store, keys: list[str], wait_s: float) -> bool:
    """Wait up to `wait_s` for every key; True when all are there. It looks again and again
    rather than with the store's own wait, whose timeout c10d logs as socket warnings on
    the user's stderr: a peer that never says is an answer here, not an error."""
    deadline = time.monotonic() + wait_s
    try:
        while not store.check(keys):
            if time.monotonic() >= deadline:
                return False
            time.sleep(SETTLE_POLL_S)
        return True
    except Exception:  # noqa: BLE001 - the store is gone
        return False


def _alive(store) -> bool:
    try:
        store.check(["nandoctor/alive"])
        return True
    except Exception:  # noqa: BLE001
        return False


def free_port() -> int:
    """A TCP port free on this host now (for a replay's own rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RankRun:
    """One rank's part in a distributed run: listen for a culprit while the script runs, and
    when it ends, settle with the other ranks who the culprit is and who was non-finite."""

    def __init__(self, info: RankInfo, channel: PeerChannel | None = None) -> None:
        self.info = info
        self.channel = channel or PeerChannel(info)
        self.script_running = False  # the user's script runs (not nandoctor's reporting)
        self.terminated = False  # a SIGTERM stopped the script with no claim (the launcher's, most likely)
        self.replayed = False  # this rank ran a replay (its own finding's, or the culprit's)
        self._replay_lock = threading.Lock()
        self._replay_result: Any = None
        # How this rank runs a replay of `steps` steps: `join_replay(steps)` is the `run` for
        # `replay_once`. Set by the session; without it a rank stopped by a peer does not join.
        self.join_replay: Callable[[int], Callable[[dict[str, str] | None], Any]] | None = None

    @classmethod
    def from_env(cls) -> "RankRun | None":
        info = RankInfo.from_env()
        return cls(info) if info is not None else None

    def listen(self, on_claim: Callable[[Claim], None], step: Callable[[], int | None],
               forwards: Callable[[], int | None]) -> None:
        """Until `settle`: on another rank's claim, tell it at once that this rank's own values
        were finite so far, and how many steps' forwards it has run (so the culprit need not
        wait for a rank stuck in a collective it left), then call `on_claim`."""
        def claimed(claim: Claim) -> None:
            self.channel.publish({"own_nonfinite": False, "step": step(), "forwards": forwards()}, final=False)
            on_claim(claim)
            # This rank may be blocked in a collective the culprit will never join (an
            # all-reduce in backward) until the culprit's process exits, and the culprit's
            # replay needs this rank first: join it from here, not from the main thread.
            threading.Thread(target=self.join_the_replay, name="nandoctor-replay-join", daemon=True).start()

        self.channel.watch(claimed)
        self._handle_sigterm()

    def _handle_sigterm(self) -> None:
        """torchrun sends SIGTERM to every rank once one exits non-zero (the culprit, with 3,
        or a rank that died), while the others are still writing that they were stopped by
        it: those finish (the launcher's SIGKILL still follows a rank that hangs). A SIGTERM
        while the script runs, with no claim, stops the script as it would without nandoctor."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            if self.channel.seen_claim or not self.script_running:
                return  # already stopping: the report is being written
            signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
            self.terminated = True
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def replay_once(self, steps: int, run: Callable[[dict[str, str] | None], Any]) -> Any:
        """This rank's part in the run's one replay, of `steps` steps: `run(environ)` starts it
        in `environ` (None when the ranks could not agree on a rendezvous) and its result is
        kept. Every rank replays together, on a fresh rendezvous; the first rank to replay
        says so, with how far, so that a rank that found nothing itself joins. Called from
        the mode (this rank's own finding) and from the thread that joins the culprit's
        replay; whichever comes second gets the first one's result."""
        with self._replay_lock:
            if not self.replayed:
                self.replayed = True
                self.channel.decide("replay", str(steps))
                self._replay_result = run(self.replay_environment())
            return self._replay_result

    @property
    def replay_result(self) -> Any:
        """What this rank's part in the run's replay gave (None before it ran)."""
        return self._replay_result

    def replay_environment(self, environ=os.environ) -> dict[str, str] | None:
        """The environment of this rank's replay: a port rank 0 picks, shared through the
        store, never the original rendezvous, whose peers are gone. None when the ranks
        could not agree on one."""
        port = self.channel.share("replay_port", str(free_port()) if self.info.rank == 0 else None)
        if port is None:
            return None
        env = {k: v for k, v in environ.items() if k not in _LAUNCH_STORE_VARIABLES}
        env["MASTER_PORT"] = port
        return env

    def no_replay(self) -> None:
        """The culprit ends without a replay: ranks waiting to join one stop waiting."""
        self.channel.decide("replay", _NO_REPLAY)

    def replay_to_join(self, wait_s: float = REPLAY_JOIN_WAIT_S) -> int | None:
        """For a rank stopped by a peer: the steps of the replay the culprit runs, which this
        rank must run too (its collectives need every rank); None when there is none."""
        said = self.channel.read("replay", wait_s)
        return int(said) if said is not None and said != _NO_REPLAY else None

    def join_the_replay(self) -> None:
        """Run the culprit's replay on this rank too, if the culprit replays (see `listen`)."""
        steps = self.replay_to_join()
        if steps is not None and self.join_replay is not None:
            self.replay_once(steps, self.join_replay(steps))

    def script_failed(self) -> bool:
        """The script raised: is that because another rank stopped (see `peer_stopped`)?"""
        self.script_running = False
        return self.peer_stopped()

    def peer_stopped(self, wait_s: float = 2.0) -> bool:
        """Has another rank claimed the run? (For an error in a collective: a peer that
        stopped makes it fail.) Waits briefly for the claim to arrive."""
        if self.channel.seen_claim:
            return True
        claim = self.channel.culprit(wait_s)
        return claim is not None and claim.rank != self.info.rank

    def settle(self, own_nonfinite: bool, found: bool, stopped: bool, step: int | None,
               phase: str | None = None, failed: bool = False) -> RankReport:
        """`own_nonfinite`: this rank's own values went non-finite (in `phase` of its step);
        `found`: it found a non-finite value (maybe one that arrived from the others:
        averaged gradients); `stopped`: it ended early for any reason (a finding, a peer's
        claim, an error); `failed`: its script failed with no finding (an error, a failing
        exit status)."""
        channel = self.channel
        channel.close()
        if own_nonfinite:
            claim = channel.claim(step, phase)
        elif stopped:
            # Averaged NaN gradients, a peer that died, a peer's claim: whoever claimed it;
            # when nobody did, a rank that found something claims it (the first one wins).
            claim = channel.culprit()
            if claim is None and found:
                claim = channel.claim(step, phase)
        else:
            claim = channel.culprit(wait_s=0.0)
        channel.publish({"own_nonfinite": own_nonfinite, "step": step})
        culprit = claim.rank if claim is not None else None
        nonfinite: list[int] = []
        if culprit is not None:
            # The culprit waits for the others' word; another rank only reads what is there.
            statuses = (channel.statuses(PEER_WAIT_S, settled=claim.covered_by) if culprit == self.info.rank
                        else channel.statuses(0.0))
            nonfinite = sorted(r for r, status in statuses.items() if status.get("own_nonfinite"))
            if own_nonfinite and self.info.rank not in nonfinite:
                nonfinite = sorted([*nonfinite, self.info.rank])
        failed_first = None
        if culprit is None and failed:
            # A peer's collective fails only once this rank's process is gone: the first
            # rank to fail says so first, and its error is the run's.
            said = channel.decide("failed_first", str(self.info.rank))
            failed_first = int(said) if said is not None else None
        info = self.info
        return RankReport(info.world_size, info.rank, info.local_rank, info.host, culprit, nonfinite,
                          claim.step if claim is not None else None,
                          stopped_by_peer=stopped and culprit is not None and culprit != info.rank and not own_nonfinite,
                          failed_first_rank=failed_first)

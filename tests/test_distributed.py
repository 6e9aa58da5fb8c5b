"""torch.distributed runs (distributed.py, cli/launcher.py).

End to end (marked `distributed`): 2 ranks with gloo on CPU, as a user launches them
(`nandoctor run --nproc-per-node 2`, which goes through torchrun). One rank's bad batch names
that rank as the culprit and the other as stopped by it; a bug every rank hits says so; a
healthy run ends with the same numbers as without nandoctor; nothing hangs (every launch has
a deadline well under the backend's timeouts).

Settling (in the default set): how ranks that stop agree on the culprit and on which ranks
went non-finite, through a real TCPStore with each rank's side run in its own thread, so the
order of events a launch leaves to chance is set here on purpose.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nandoctor import distributed
from nandoctor.detect.observer import Observer, PeerStopped
from nandoctor.distributed import Claim, RankInfo, RankRun

SCRIPT = Path(__file__).resolve().parent.parent / "sample_scripts" / "distributed" / "ddp_regression.py"
DEADLINE_S = 90

launch = pytest.mark.distributed


def _launch(tmp_path: Path, *options: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--json", str(tmp_path / "r.json"),
         "--rank-reports", *options, str(SCRIPT)],
        cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env))
    return proc, time.monotonic() - started


def _report(tmp_path: Path, name: str = "r.json") -> dict:
    return json.loads((tmp_path / name).read_text())


@launch
@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_one_ranks_bad_batch_names_that_rank_its_step_and_sample(tmp_path, mode):
    proc, elapsed = _launch(tmp_path, "--mode", mode, BAD_INDEX="55")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    dist = report["distributed"]
    assert (dist["rank"], dist["culprit_rank"], dist["ranks_nonfinite"], dist["world_size"]) == (1, 1, [1], 2)
    assert report["step"] == 3 and report["root"]["phase"] == "data"
    assert report["root"]["facts"]["dataset_indices"] == [55]
    assert report["cause"]["id"] == "nonfinite_input_data"
    assert "rank 0: stopped: rank 1 found a non-finite value at step 3" in proc.stderr
    assert proc.stderr.count("╭─ nandoctor") == 1  # the report is printed once, by the culprit
    assert "ChildFailedError" not in proc.stderr and "Traceback" not in proc.stderr  # torchrun's own, about it
    assert "closing signal" not in proc.stderr and "failed (exitcode: 3)" not in proc.stderr
    rank0 = _report(tmp_path, "r.rank0.json")
    assert rank0["distributed"]["culprit_rank"] == 1 and rank0["exit_code"] == 3
    assert elapsed < 60


@launch
def test_a_rank_stopped_inside_a_collective_joins_the_culprits_replay(tmp_path):
    # Rank 1 raises over its NaN loss before backward(): rank 0 waits in backward's
    # all-reduce until rank 1's process exits, but rank 1's replay needs rank 0 first.
    # Rank 0 joins it from its listening thread, and the replay finds the batch.
    proc, elapsed = _launch(tmp_path, "--mode", "watch", BAD_INDEX="55", CHECK_LOSS="1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["reproduced"] is True and report["distributed"]["culprit_rank"] == 1
    assert report["root"]["phase"] == "data" and report["root"]["facts"]["dataset_indices"] == [55]
    assert _report(tmp_path, "r.rank0.json")["distributed"]["stopped_by_peer"] is True
    assert elapsed < 60


@launch
def test_with_no_finding_the_run_report_is_the_error_of_the_rank_that_failed_first(tmp_path):
    # Rank 1's IndexError, not rank 0's "connection closed by peer" that it caused.
    proc, elapsed = _launch(tmp_path, RAISE_AT="2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["status"] == "script_error" and report["error"]["type"] == "IndexError"
    assert report["distributed"]["rank"] == 1 and report["distributed"]["failed_first_rank"] == 1
    assert _report(tmp_path, "r.rank0.json")["distributed"]["failed_first_rank"] == 1
    assert elapsed < 60


@launch
def test_a_bug_every_rank_hits_is_reported_as_such(tmp_path):
    proc, _ = _launch(tmp_path, LOG_ZERO="1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["distributed"]["ranks_nonfinite"] == [0, 1]
    assert report["root"]["op"] == "aten.log.default" and report["cause"]["id"] == "log_nonpositive"
    assert Path(report["root"]["location"]["file"]).name == SCRIPT.name
    assert any("every rank" in note for note in report["notes"])


@launch
def test_a_nan_one_rank_makes_and_a_collective_carries_is_that_ranks_alone(tmp_path):
    # Rank 0 computes with the NaN all_gather brought it from rank 1: received, not its own.
    proc, elapsed = _launch(tmp_path, SHARED_SCALE="1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    dist = report["distributed"]
    assert (dist["culprit_rank"], dist["ranks_nonfinite"]) == (1, [1])
    assert report["root"]["op"] == "aten.div.Tensor" and report["cause"]["id"] == "div_by_zero"
    assert report["root"]["location"]["line"] == _line_of("scale = mine / mine")
    rank0 = _report(tmp_path, "r.rank0.json")
    assert rank0["root"]["facts"].get("received_from_peers") is True
    assert elapsed < 60


@launch
def test_in_watch_mode_a_nan_seen_first_in_averaged_gradients_is_settled_by_the_replay(tmp_path):
    # Both ranks see NaN gradients only after DDP averaged them, and either may claim first;
    # each rank's replay, op by op, says whose own backward made it: rank 1's sqrt(0).
    proc, elapsed = _launch(tmp_path, "--mode", "watch", SQRT_ZERO="1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    dist = report["distributed"]
    assert (dist["rank"], dist["culprit_rank"], dist["ranks_nonfinite"]) == (1, 1, [1])
    assert report["cause"]["id"] == "sqrt_zero_backward"
    assert report["root"]["location"]["line"] == _line_of("torch.sqrt(out.pow(2).sum() * (rank != 1))")
    assert proc.stderr.count("╭─ nandoctor") == 1
    assert elapsed < 90


def _line_of(code: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if code in text)


def _plain_torchrun(tmp_path: Path) -> subprocess.CompletedProcess:
    """The script under plain torchrun, nothing of nandoctor's loaded: the reference. Once
    in a fresh-clone CI run (2026-11-23) a plain rank died of SIGABRT in torch itself, its
    peer SIGTERMed after it; a reference that a signal killed is run once more."""
    for _ in range(2):
        plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)],
                               cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S,
                               stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if plain.returncode == 0 or "received by PID" not in plain.stderr:
            break
    return plain


@launch
def test_a_healthy_run_is_clean_with_the_same_numbers_as_plain_torchrun(tmp_path):
    plain = _plain_torchrun(tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    proc, _ = _launch(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == plain.stdout and "final" in proc.stdout  # rank 0's final parameter sum
    report = _report(tmp_path)
    assert report["status"] == "clean" and report["distributed"]["culprit_rank"] is None


@launch
def test_fsdp2_is_watched_the_same_way(tmp_path):
    script = SCRIPT.with_name("fsdp2_regression.py")
    proc = subprocess.run(
        [sys.executable, "-m", "nandoctor", "run", "--nproc-per-node", "2", "--json", str(tmp_path / "r.json"),
         str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1", BAD="1"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["distributed"]["culprit_rank"] == 1 and report["step"] == 3
    assert report["root"]["location"]["line"] == 21  # x[0, 0] = float("nan")


@launch
def test_a_peer_that_dies_is_told_apart_from_a_finding(tmp_path):
    proc, elapsed = _launch(tmp_path, DIE_AT="2")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the script's error, as without nandoctor
    report = _report(tmp_path)
    assert report["status"] == "script_error" and report["distributed"]["culprit_rank"] is None
    assert any("another rank's process is gone" in note for note in report["notes"])
    assert elapsed < 60


@launch
def test_a_rank_the_launcher_stops_after_a_peer_died_says_so_not_clean(tmp_path):
    # Rank 1 dies while rank 0 is busy with its own work: no collective fails, torchrun's
    # SIGTERM stops rank 0, whose report must not read as a clean run.
    proc, elapsed = _launch(tmp_path, DIE_AT="2", DIE_WHILE="busy")
    assert proc.returncode == 143, proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["status"] == "script_error" and report["error"]["type"] == "SIGTERM"
    assert report["distributed"]["culprit_rank"] is None
    assert any("another rank's process most likely failed" in note for note in report["notes"])
    assert "was stopped by SIGTERM" in proc.stderr
    assert elapsed < 60


@launch
def test_a_rank_killed_by_a_signal_gets_the_one_line_it_could_not_write_itself(tmp_path):
    proc, elapsed = _launch(tmp_path, DIE_AT="2", DIE_WHILE="busy", DIE_HOW="kill")
    assert proc.returncode == 143, proc.stderr[-3000:]  # rank 0's report: stopped by the launcher
    assert "nandoctor: rank 1 was killed by SIGKILL" in proc.stderr
    assert "ChildFailedError" not in proc.stderr
    assert elapsed < 60


# -- settling: who the culprit is, which ranks went non-finite --------------------------------

@pytest.fixture
def store_port():
    """A real TCPStore, as torchrun's agent hosts one; the ranks connect to it as clients."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield server.port
    del server


def _rank(rank: int, port: int) -> RankRun:
    info = RankInfo(rank, rank, 2, "host")
    return RankRun(info, distributed.PeerChannel(info, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}))


def _settle_in_thread(run: RankRun, **how) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def settle():
        started = time.monotonic()
        out["report"] = run.settle(**how)
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=settle)
    thread.start()
    return thread, out


def _listen(run: RankRun, step: int, forwards: int) -> threading.Event:
    heard = threading.Event()
    run.listen(lambda claim: heard.set(), lambda: step, lambda: forwards)
    return heard


def test_a_peer_that_heard_the_claim_before_running_the_culprits_forward_is_waited_for(store_port):
    # The race a launch leaves to chance: rank 1 hears rank 0's claim for a NaN in step 2's
    # forward while it is still finishing step 1, says so at once, then runs step 2's forward
    # and finds its own NaN there: the culprit's report says every rank hit it.
    culprit, peer = _rank(0, store_port), _rank(1, store_port)
    heard = _listen(peer, step=2, forwards=2)
    thread, out = _settle_in_thread(culprit, own_nonfinite=True, found=True, stopped=True, step=2, phase="forward")
    assert heard.wait(10)
    time.sleep(0.3)  # rank 1 runs on to step 2's forward
    mine = peer.settle(own_nonfinite=True, found=True, stopped=True, step=2, phase="forward")
    thread.join(10)
    report = out["report"]
    assert (report.culprit_rank, report.ranks_nonfinite, report.culprit_step) == (0, [0, 1], 2)
    assert mine.culprit_rank == 0 and not mine.stopped_by_peer


@pytest.mark.parametrize("phase, forwards", [
    # Rank 1 had run step 2's forward when it heard (it may now wait in a collective rank 0
    # never joins): its word that its values were finite is final.
    ("forward", 3),
    # One rank's bad data: the others stop at their next step boundary without running the
    # culprit's forward (its collectives would wait for the culprit): their word is final.
    ("data", 2),
])
def test_a_peers_first_word_is_final_when_it_will_not_run_the_culprits_forward(store_port, monkeypatch,
                                                                              phase, forwards):
    monkeypatch.setattr(distributed, "PEER_WAIT_S", 30.0)
    culprit, peer = _rank(0, store_port), _rank(1, store_port)
    heard = _listen(peer, step=2, forwards=forwards)
    thread, out = _settle_in_thread(culprit, own_nonfinite=True, found=True, stopped=True, step=2, phase=phase)
    assert heard.wait(10)
    thread.join(20)
    assert out["report"].ranks_nonfinite == [0] and out["seconds"] < 10  # nothing waited for more
    peer.channel.close()


def test_a_peer_that_never_says_more_is_given_up_on_after_the_wait(store_port, monkeypatch):
    monkeypatch.setattr(distributed, "PEER_WAIT_S", 0.5)
    culprit, peer = _rank(0, store_port), _rank(1, store_port)
    heard = _listen(peer, step=2, forwards=2)  # ...and then stuck, never to settle
    thread, out = _settle_in_thread(culprit, own_nonfinite=True, found=True, stopped=True, step=2, phase="forward")
    assert heard.wait(10)
    thread.join(10)
    assert not thread.is_alive() and out["report"].ranks_nonfinite == [0]
    peer.channel.close()


def test_a_word_that_never_comes_is_waited_for_without_c10d_timeout_warnings(store_port, capfd):
    # A peer that never says is an answer (no culprit), not an error: the store's own wait
    # would log "waitForInput ... timed out" on the user's stderr when it gives up.
    client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    started = time.monotonic()
    assert distributed._wait(client, ["nandoctor/never"], 0.3) is False
    assert 0.3 <= time.monotonic() - started < 5
    client.set("nandoctor/there", "1")
    assert distributed._wait(client, ["nandoctor/there"], 0.3) is True
    assert "waitForInput" not in capfd.readouterr().err


def _observer_told(claim: Claim, step: int) -> Observer:
    observer = Observer({})
    observer.state.optimizer_created()
    observer.state.step = step
    observer.peer_claimed(claim)
    return observer


def test_a_rank_runs_the_forward_of_the_step_where_the_culprit_found_a_forward_value():
    observer = _observer_told(Claim(0, step=2, phase="forward"), step=2)
    observer.check_peers()  # step 2's forward has not run here yet: run it
    observer.state.backward_started = True
    with pytest.raises(PeerStopped):
        observer.check_peers()  # ...and no further than its backward()


@pytest.mark.parametrize("phase", ["data", "backward", "optimizer", None])
def test_a_rank_stops_at_its_next_boundary_when_the_culprits_value_was_not_a_forwards(phase):
    observer = _observer_told(Claim(0, step=2, phase=phase), step=2)
    with pytest.raises(PeerStopped):
        observer.check_peers()


def test_a_claim_with_no_step_stops_a_rank_at_once():
    observer = _observer_told(Claim(0, step=None, phase="forward"), step=0)
    with pytest.raises(PeerStopped):
        observer.check_peers()


class TestValuesACollectiveWrote:
    """What `dist.all_reduce` / `all_gather` wrote in place is recorded by where it came from."""

    @staticmethod
    def _detector():
        from nandoctor.config import load_config
        from nandoctor.detect.detector import Detector

        return Detector(load_config().run)

    def test_a_nan_no_record_of_this_ranks_covers_was_received_from_a_peer(self):
        arrived = torch.tensor([1.0, float("nan")])  # (made before the detector: as a peer's bytes are)
        with self._detector() as detector:
            detector.values_received("all_reduce", arrived, [])
            record = detector.records.get(arrived)
        assert record is not None and record.facts.received_from_peers and record.op == "torch.distributed.all_reduce"

    def test_near_miss_this_ranks_own_nan_gathered_back_keeps_its_own_record(self):
        gathered = [torch.tensor(1.0), torch.tensor(float("nan"))]
        with self._detector() as detector:
            zero = torch.zeros(())
            mine = zero / zero  # this rank's own 0/0, sent to all_gather
            detector.values_received("all_gather", gathered, [mine])
            made = detector.records.get(mine)
            assert made is not None and detector.records.get(gathered[1]) is made

    @staticmethod
    @contextlib.contextmanager
    def _group_of_one(tmp_path):
        hook = sys.excepthook  # (init_process_group wraps it to prefix "[rank0]:", for good)
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            yield
        finally:
            torch.distributed.destroy_process_group()
            sys.excepthook = hook

    def test_tensors_an_object_collective_unpickled_were_received_from_a_peer(self, tmp_path):
        # `all_gather_object` unpickles every rank's object, this rank's too: a copy, no record.
        stats = {"inv_std": torch.tensor([1.0, float("inf")])}  # (made before the detector: a peer's)
        gathered = [None]
        with self._group_of_one(tmp_path), self._detector() as detector:
            torch.distributed.all_gather_object(gathered, stats)
            record = detector.records.get(gathered[0]["inv_std"])
        assert record is not None and record.facts.received_from_peers
        assert record.op == "torch.distributed.all_gather_object"

    def test_near_miss_this_ranks_own_object_gathered_back_keeps_its_own_record(self, tmp_path):
        gathered = [None]
        with self._group_of_one(tmp_path), self._detector() as detector:
            zero = torch.zeros(2)
            mine = torch.ones(2) / zero  # this rank's own x/0
            torch.distributed.all_gather_object(gathered, [mine])
            assert detector.records.get(gathered[0][0]) is detector.records.get(mine) is not None

    def test_near_miss_a_lone_minus_inf_received_stays_a_sentinel(self):
        # A running max all_reduce'd with MAX from ranks that saw nothing yet: -inf, on purpose.
        best = torch.tensor([float("-inf")])
        with self._detector() as detector:
            detector.values_received("all_reduce", best, [])
            record = detector.records.get(best)
        assert record is not None and record.intended and record.facts.received_from_peers

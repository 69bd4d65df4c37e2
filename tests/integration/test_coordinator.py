"""The coordinator as a real process, with real consumer processes and SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from stoker.coordinator.client import ConfirmCall, CoordinatorClient, LeaseRejected
from stoker.errors import ConsumerExpired, CoordinatorRefused

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import free_port

CONSUMER = Path(__file__).with_name("_lease_consumer.py")


class Coordinators:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.output: dict[subprocess.Popen[str], str] = {}

    def start(self, *args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.cli", "coordinator", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "serving" in line:
                self.output[proc] = "".join(seen)
                return proc, line.split("serving ")[1].split()[0]
        raise AssertionError("coordinator did not start:\n" + "".join(seen))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


@pytest.fixture
def coordinators():
    c = Coordinators()
    yield c
    c.close()


def consumer(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CONSUMER), json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> int:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"consumer failed:\n{out}\n{err}"
    return int(out.strip().splitlines()[-1].split()[1])


def delivered(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_coordinator_killed_mid_epoch_loses_and_repeats_nothing(
    tmp_path: Path, coordinators: Coordinators
) -> None:
    port = free_port()
    args = ["--bind", f"127.0.0.1:{port}", "--state", str(tmp_path / "state"), "--world", "2",
            "--num-samples", "2000", "--lease-size", "50", "--timeout", "30"]  # fmt: skip
    first, address = coordinators.start(*args)
    procs, outs = [], []
    for i, (rank, worker) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        out = tmp_path / f"c{i}.txt"
        cfg = dict(address=address, rank=rank, worker=worker, out=str(out), step=7,
                   pause_after=5 if i == 0 else None, delay=0.01 if i == 3 else 0)  # fmt: skip
        procs.append(consumer(cfg))
        outs.append(out)
    for proc in procs:  # every consumer joined epoch 0 before anything else happens
        assert proc.stdout is not None and proc.stdout.readline().split()[::2] == [
            "registered",
            "0",
        ]
    assert procs[0].stdout.readline().strip() == "paused"  # type: ignore[union-attr]
    first.send_signal(signal.SIGKILL)
    first.wait()
    coordinators.start(*args)  # same port, same journal
    procs[0].stdin.write("go\n")  # type: ignore[union-attr]
    procs[0].stdin.flush()  # type: ignore[union-attr]
    counts = [finish(p) for p in procs]
    got = [p for out in outs for p in delivered(out)]
    dupes = [p for p, n in Counter(got).items() if n > 1]
    assert not dupes, f"delivered twice: {dupes[:10]}"
    assert sorted(got) == list(range(2000))
    assert counts[0] + counts[1] == counts[2] + counts[3] == 1000  # equal per rank


def test_what_a_consumer_was_told_survives_a_kill_right_after(
    tmp_path: Path, coordinators: Coordinators
) -> None:
    """Grants, steals and raised horizons are journaled before they are answered: a
    coordinator SIGKILLed the moment after answering restarts knowing them."""
    port = free_port()
    args = ["--bind", f"127.0.0.1:{port}", "--state", str(tmp_path / "state"), "--world", "1",
            "--num-samples", "400", "--lease-size", "200", "--timeout", "30"]  # fmt: skip
    procs = [coordinators.start(*args)[0]]
    address = f"127.0.0.1:{port}"
    client = CoordinatorClient(address, retry_for=60)
    a, epoch = client.register(0, 0)
    b, _ = client.register(0, 1)

    def kill_and_restart() -> None:
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        procs[0] = coordinators.start(*args)[0]

    def read_some(consumer: int, r: Any) -> None:
        limits = client.heartbeat(consumer, epoch, r.lease, r.start)
        assert limits[r.lease][0] == r.end  # the lease as it was answered
        kill_and_restart()  # the horizon it was told, too
        upto = min(limits[r.lease][1], r.end, r.start + 10)
        client.heartbeat(consumer, epoch, r.lease, upto)
        client.confirm(consumer, epoch, r.lease, upto)

    first = client.lease(a, epoch, [])  # a fresh lease
    kill_and_restart()
    read_some(a, first)
    second = client.lease(b, epoch, [])  # the rest of the queue
    kill_and_restart()
    read_some(b, second)
    stolen = client.lease(b, epoch, [second.lease])  # half of a's unread part
    assert first.start < stolen.start < first.end
    kill_and_restart()
    read_some(b, stolen)
    limits = client.heartbeat(a, epoch, first.lease, first.start + 10)
    assert limits[first.lease][0] == stolen.start  # a's lease ends where the steal began


def test_refusals_name_the_reason(tmp_path: Path, coordinators: Coordinators) -> None:
    _, address = coordinators.start(
        "--state", str(tmp_path / "s"), "--world", "2", "--num-samples", "100"
    )
    client = CoordinatorClient(address, retry_for=5)
    cid, epoch = client.register(0, 0)
    with pytest.raises(LeaseRejected, match=r"epoch 7.*coordinator is in 0") as err:
        client.lease(cid, 7, [])
    assert err.value.code == "FAILED_PRECONDITION" and err.value.reason == "wrong_epoch"
    assert not isinstance(err.value, ConsumerExpired)
    with pytest.raises(LeaseRejected, match="never registered") as err:
        client.lease(12345, epoch, [])
    assert err.value.code == "NOT_FOUND" and err.value.reason == "unknown_consumer"
    with pytest.raises(LeaseRejected, match="outside the job's world"):
        client.register(5, 0)
    # a mixture's description says how many positions an epoch holds: 3 x 4 x 2 = 24
    mixture = json.dumps({"mixture": {}, "steps_per_epoch": 3, "batch_size": 4, "world": 2})
    with pytest.raises(LeaseRejected, match=r"24 positions an epoch.*--num-samples 24") as err:
        client.register(1, 0, stream=mixture)
    assert err.value.reason == "bad_stream"
    r = client.lease(cid, epoch, [])
    with pytest.raises(LeaseRejected, match="outside") as err:
        client.heartbeat(cid, epoch, r.lease, r.horizon + 1)  # beyond the read horizon
    assert err.value.code == "INVALID_ARGUMENT"
    with pytest.raises(LeaseRejected, match="not held"):
        client.confirm(cid, epoch, r.lease + 99, 1)
    # in a Batch, each refusal carries its reason too
    [answer] = client.confirm_batches([ConfirmCall(cid, 7, 0, [(r.lease, r.start + 1, 1)], 1)])
    assert isinstance(answer, CoordinatorRefused) and answer.reason == "wrong_epoch"
    # the table is intact: the lease is still usable
    client.heartbeat(cid, epoch, r.lease, r.horizon)
    client.confirm(cid, epoch, r.lease, r.horizon)


def test_a_batch_answers_each_call_as_if_alone_and_survives_a_restart(
    tmp_path: Path, coordinators: Coordinators
) -> None:
    from stoker._proto import coordinator_pb2 as pb

    args = ("--state", str(tmp_path / "s"), "--world", "2", "--num-samples", "100",
            "--lease-size", "10", "--min-readahead", "10")  # fmt: skip
    proc, address = coordinators.start(*args)
    client = CoordinatorClient(address, retry_for=20)
    a, epoch = client.register(0, 0)
    b, _ = client.register(1, 0)
    out = client.batch([
        pb.Call(lease=pb.LeaseRequest(consumer=a, epoch=epoch)),
        pb.Call(lease=pb.LeaseRequest(consumer=b, epoch=epoch)),
        pb.Call(lease=pb.LeaseRequest(consumer=999, epoch=epoch)),
        pb.Call(confirm=pb.ConfirmRequest(consumer=a, epoch=epoch, lease=77, upto=1)),
    ])  # fmt: skip
    assert [r.WhichOneof("kind") for r in out] == ["lease", "lease", "error", "error"]
    ga, gb = out[0].lease, out[1].lease
    assert (ga.start, ga.end, gb.start, gb.end) == (0, 10, 10, 20)  # as if sent one by one
    assert out[2].error.code == "NOT_FOUND" and "never registered" in out[2].error.message
    assert out[3].error.code == "NOT_FOUND" and "not held" in out[3].error.message
    done = client.batch([
        pb.Call(confirm=pb.ConfirmRequest(consumer=a, epoch=epoch, lease=ga.lease, upto=10)),
        pb.Call(confirm=pb.ConfirmRequest(consumer=b, epoch=epoch, lease=gb.lease, upto=14)),
    ])  # fmt: skip
    assert [r.WhichOneof("kind") for r in done] == ["confirm", "confirm"]
    assert [r.confirm.lease_done for r in done] == [True, False]
    # the confirms were journaled before the answer: a restarted coordinator has them
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, address = coordinators.start(*args[:-4], "--lease-size", "10", "--min-readahead", "10",
                                    "--bind", address)  # fmt: skip
    st = client.status()
    assert st.consumed == 14
    assert client.confirm(b, epoch, gb.lease, gb.end) is True  # b's lease survived


def test_off_loopback_needs_a_token(tmp_path: Path, coordinators: Coordinators) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "coordinator", "--bind", "0.0.0.0:0", "--state",
         str(tmp_path / "s"), "--world", "1", "--num-samples", "10"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "shared token" in proc.stderr
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    port = free_port()
    proc, _ = coordinators.start("--bind", f"0.0.0.0:{port}", "--state", str(tmp_path / "s"),
                                 "--world", "1", "--num-samples", "10", "--token-file", str(token))  # fmt: skip
    address = f"127.0.0.1:{port}"  # reached over loopback; the token is still required
    with pytest.raises(LeaseRejected) as err:
        CoordinatorClient(address, retry_for=5).register(0, 0)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED.name
    with pytest.raises(LeaseRejected):
        CoordinatorClient(address, token="wrong", retry_for=5).register(0, 0)
    assert CoordinatorClient(address, token="s3cret-token").register(0, 0)[0] >= 1
    proc.terminate()
    rest, _ = proc.communicate(timeout=30)
    assert "s3cret" not in coordinators.output[proc] + rest  # the token is never logged


def test_a_consumer_silent_past_the_timeout_registers_again_and_loses_nothing(
    tmp_path: Path, coordinators: Coordinators
) -> None:
    """A worker pauses longer than the timeout (a long GC, a stalled disk): its leases go
    back to the queue; when it wakes it registers again and the epoch completes once."""
    import time

    from stoker.coordinator.consumer import LeaseStream

    _, address = coordinators.start(
        "--state", str(tmp_path / "s"), "--world", "1", "--num-samples", "200",
        "--lease-size", "50", "--timeout", "1", "--min-readahead", "20",
    )  # fmt: skip
    client = CoordinatorClient(address, retry_for=20)
    stream = LeaseStream(client, 0, 0)
    batches = stream.batches(10)
    delivered: list[int] = []
    seq = 0

    def confirm(positions, segments) -> None:
        nonlocal seq
        answers = client.confirm_batch(stream.consumer, stream.epoch, seq, segments, 10)
        seq += 1
        row = 0
        for (_, _, rows), ok in zip(segments, answers, strict=True):
            if ok is not None:
                delivered.extend(positions[row : row + rows].tolist())
            row += rows

    for _ in range(3):
        confirm(*next(batches))
    first_id = stream.consumer
    deadline = time.monotonic() + 30
    while client.status().live_consumers and time.monotonic() < deadline:
        time.sleep(0.05)  # silence: the coordinator's expiry thread has to notice
    assert client.status().live_consumers == 0 and client.status().requeued > 0
    with pytest.raises(ConsumerExpired) as err:  # the refusal has a class of its own
        client.heartbeat(first_id, stream.epoch)
    assert err.value.reason == "expired_consumer" and err.value.code == "FAILED_PRECONDITION"
    for positions, segments in batches:
        confirm(positions, segments)
    assert stream.reregistered == 1 and stream.consumer != first_id
    assert sorted(delivered) == list(range(200))  # every position once, none lost


def test_a_consumer_that_joins_after_its_epoch_ended_hands_out_nothing(
    tmp_path: Path, coordinators: Coordinators
) -> None:
    """A rank's worker that starts late, when its fellow workers already finished the
    epoch, could only register in the next one: it must not hand the next epoch's
    positions into this epoch's pass (a confirm for an unknown consumer, before)."""
    from stoker.coordinator.consumer import LeaseStream

    _, address = coordinators.start(
        "--state", str(tmp_path / "s"), "--world", "1", "--num-samples", "40"
    )  # fmt: skip
    client = CoordinatorClient(address, retry_for=20)
    first = LeaseStream(client, 0, 0, min_epoch=0, max_epoch=0)
    for seq, (_, segments) in enumerate(first.batches(8)):
        answers = client.confirm_batch(first.consumer, first.epoch, seq, segments, 8)
        assert None not in answers
    assert client.status().epoch == 1  # epoch 0 is done
    late = LeaseStream(client, 0, 1, min_epoch=0, max_epoch=0)
    assert late.epoch == 1 and list(late.batches(8)) == []  # nothing of epoch 1 here
    unbounded = LeaseStream(client, 0, 2, min_epoch=0)  # without the bound it joins epoch 1
    assert unbounded.epoch == 1 and next(unbounded.batches(8))[0].size > 0

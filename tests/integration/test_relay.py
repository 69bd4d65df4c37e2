"""A node's coordinator calls through its agent (:mod:`stoker.coordinator.relay`): a
real agent process, a coordinator served in this process (so its per-method call
counts can be read), a loader with three worker processes. The workers' Lease and
Heartbeat calls and the rank's ConfirmBatch calls reach the coordinator only inside
the agent's Batch messages; with the agent SIGKILLed mid-epoch the processes make
their calls themselves, and every sample still comes once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import stoker
from stoker.cache.paths import AgentPaths
from stoker.coordinator.client import CoordinatorClient
from stoker.coordinator.server import Server
from stoker.coordinator.service import Coordinator

from .helpers import one_rank, write_dataset  # noqa: F401 (one_rank: a fixture)
from .test_agent import Agents

SEQ_LEN, B = 16, 4
ALONE = ("Lease", "Heartbeat", "Confirm", "ConfirmBatch")

pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def long_epoch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 3,000 batches: far more than a rank confirms ahead (256), so calls go on
    after any early batch."""
    root = tmp_path_factory.mktemp("relay")
    return write_dataset(root / "ds", num_docs=1000, seed=5, block_tokens=512).path


def calls(c: Coordinator) -> dict[str, int]:
    with c.metrics._lock:
        return {m: h.count for m, h in c.metrics.latency.items()}


def serve(ds: stoker.TokenDataset, tmp_path: Path) -> Server:
    return Server(Coordinator(ds.num_samples, 1, str(tmp_path / "state"))).start()


def test_a_nodes_calls_reach_the_coordinator_only_in_its_agents_messages(
    long_epoch: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache)
    ds = stoker.TokenDataset(str(long_epoch), SEQ_LEN, batch_size=B, agent=agents.client(cache))
    server = serve(ds, tmp_path)
    try:
        client = CoordinatorClient(server.address, server.token)
        loader = stoker.TokenLoader(ds, 3, coordinator=client)
        ids = [i for b in loader for i in b["sample_id"].tolist()]
        loader.close()
        seen = calls(server.coordinator)
    finally:
        server.stop(0)
    stats = Agents.stats(cache)
    assert sorted(ids) == list(range(ds.num_samples))
    assert [m for m in ALONE if seen.get(m)] == []  # none came alone
    # every Batch message came from the agent, each carrying the node's calls
    assert seen["Batch"] == stats["relay_messages"] > 0
    leases = server.coordinator.metrics.done["granted"] + server.coordinator.table.granted
    confirms = -(-len(ids) // B) // 256  # at least one ConfirmBatch per window of batches
    assert stats["relay_calls"] >= leases + confirms
    assert stats["relay_calls"] > stats["relay_messages"]


@pytest.mark.filterwarnings("ignore:the stoker agent at .* is not running:RuntimeWarning")
def test_with_the_agent_killed_mid_epoch_processes_call_themselves_and_miss_nothing(
    long_epoch: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    proc = agents.start(cache)
    ds = stoker.TokenDataset(str(long_epoch), SEQ_LEN, batch_size=B, agent=agents.client(cache))
    server = serve(ds, tmp_path)
    ids: list[int] = []
    try:
        client = CoordinatorClient(server.address, server.token)
        loader = stoker.TokenLoader(ds, 2, coordinator=client)
        for k, b in enumerate(loader):
            ids += b["sample_id"].tolist()
            if k == 3:
                before = calls(server.coordinator)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        loader.close()
        after = calls(server.coordinator)
    finally:
        server.stop(0)
    assert sorted(ids) == list(range(ds.num_samples))  # once each, nothing lost
    assert [m for m in ALONE if before.get(m)] == []
    assert sum(after.get(m, 0) for m in ALONE) > 0  # made directly once the agent was gone


def test_a_link_on_a_high_descriptor_a_cancel_and_an_unreachable_coordinator(
    tmp_path: Path, agents: Agents
) -> None:
    """A RelayLink against a real agent: a process with a thousand files open (its socket
    above 1023) is carried; a call given up (the Confirmer closing) raises at once while
    the agent still retries; a coordinator the agent cannot reach sends the process to
    call it itself."""
    import resource
    import threading
    import time

    from servers import free_port

    from stoker._proto import coordinator_pb2 as pb
    from stoker.coordinator.relay import RelayLink
    from stoker.errors import CoordinatorUnavailable

    cache = tmp_path / "cache"
    agents.start(cache)
    socket_path = str(AgentPaths(cache).socket)
    server = Server(Coordinator(100, 1, str(tmp_path / "state"))).start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        direct = CoordinatorClient(server.address, server.token)
        consumer, epoch = direct.register(0, 0)
        link = RelayLink(socket_path)
        call = pb.Call(lease=pb.LeaseRequest(consumer=consumer, epoch=epoch))
        got = link.call(server.address, server.token, [call], timeout=5.0, retry_for=5.0)
        assert got is not None and got[0].lease.status == pb.LeaseReply.GRANTED
        assert link._local.conn.sock.fileno() > 1023 and link.relayed == 1
        # nobody listens there: the agent retries for a minute, the cancel ends the wait
        nowhere = f"127.0.0.1:{free_port()}"
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        t = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match="given up"):
            link.call(nowhere, "", [call], timeout=1.0, retry_for=60.0, cancel=cancel)
        assert time.monotonic() - t < 20  # not the agent's 60 s of retrying
        # the agent gives up on it after 0.5 s: the process is told to call itself
        assert link.call(nowhere, "", [call], timeout=0.5, retry_for=0.5) is None
        assert not link.usable() and link.direct == 1
        link.close()
        direct.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        server.stop(0)

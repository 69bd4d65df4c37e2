"""Machines for multi-machine tests: Linux network namespaces on a bridge (needs root).

``Topology({"origin": 2, "n0": 10})`` makes one network namespace per role, each
with an ``eth0`` (a veth whose other end is on a bridge in the root namespace)
at ``10.88.X.<host>/24`` and ``lo`` up; the bridge itself is ``10.88.X.1``. X is a
subnet no interface of the root namespace uses yet. Nothing routes anywhere
else: the namespaces have no default route, so their traffic stays on the bridge.

Names carry this process's pid namespace, its pid and a random tag
(``stoker-it-<pidns>-<pid>-<tag>-<role>`` for namespaces; interfaces, whose
names are short, carry the same string as their alias), so parallel runs never
collide, and :func:`reap_stale` removes what a run that died without cleaning
up left behind (its pid gone; only runs of this pid namespace, whose pids it
can check).

:meth:`Topology.destroy` kills every process in every namespace (``ip netns
pids``, SIGKILL, waiting on pidfds), reaps the children this process started,
and deletes the namespaces, the veths and the bridge; it never raises, so it
is safe in a finalizer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.runtime import alive

PREFIX = "stoker-it"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-[0-9a-f]+(-[A-Za-z0-9]+)?$")


def _pidns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _stale(name: str) -> bool:
    """A name of ours made by a process of this pid namespace that is gone."""
    m = _NAME.match(name)
    return m is not None and int(m.group(1)) == _pidns() and not alive(int(m.group(2)))


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no ``ip``, no permission)."""


def sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a command (ip, tc) and return its output; raise with its stderr on failure."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_pids(netns: str) -> list[int]:
    """Processes in a namespace (none once it is gone)."""
    out = sh("ip", "netns", "pids", netns, check=False).stdout
    return [int(x) for x in out.split()]


def kill_pids(pids_of: Any, timeout: float = 15.0) -> list[int]:
    """SIGKILL what ``pids_of()`` lists until it lists nothing; returns the pids that
    would not die before ``timeout`` (empty on success). Waits on pidfds, so a pid
    counts as dead when the process has exited, child of ours or not."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in pids_of() if p != os.getpid()]
        if not pids:
            return []
        fds = []
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue  # already gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            pending = list(fds)
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return pids
                ready, _, _ = select.select(pending, [], [], left)
                pending = [fd for fd in pending if fd not in ready]
        finally:
            for fd in fds:
                os.close(fd)
        if time.monotonic() > deadline:
            return pids_of()


def reap_stale() -> None:
    """Remove namespaces, bridges and veths of runs whose process is gone."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if _stale(name):
            kill_pids(lambda name=name: netns_pids(name), timeout=5.0)
            sh("ip", "netns", "del", name, check=False)
    for kind in ("veth", "bridge"):
        out = sh("ip", "-j", "link", "show", "type", kind, check=False).stdout
        try:
            links = json.loads(out) if out.strip() else []
        except ValueError:
            continue
        for link in links:
            if _stale(str(link.get("ifalias", ""))):
                sh("ip", "link", "del", str(link["ifname"]), check=False)


def _used_subnets() -> set[int]:
    """Third octets of the 10.88.*.* addresses the root namespace has."""
    out = sh("ip", "-j", "-4", "addr", "show", check=False).stdout
    used = set()
    try:
        links = json.loads(out) if out.strip() else []
    except ValueError:
        links = []
    for link in links:
        for a in link.get("addr_info", []):
            parts = str(a.get("local", "")).split(".")
            if parts[:2] == ["10", "88"] and len(parts) == 4:
                used.add(int(parts[2]))
    return used


@dataclass(frozen=True)
class Host:
    """One namespace: ``role`` (the test's name for it), its namespace and address."""

    role: str
    netns: str
    address: str
    veth: str  # the root-namespace end of its link (on the bridge)

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec`` execs, it does not fork)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


class Topology:
    """Namespaces by role on one bridge; :meth:`create`, then :meth:`destroy`."""

    def __init__(self, roles: Mapping[str, int]) -> None:
        for role, host in roles.items():
            if not re.fullmatch(r"[A-Za-z0-9]+", role) or not 2 <= host <= 254:
                raise ValueError(f"bad role {role!r} or host number {host}")
        self.tag = f"{PREFIX}-{_pidns()}-{os.getpid()}-{secrets.token_hex(3)}"
        short = hashlib.sha256(self.tag.encode()).hexdigest()[:6]
        self.bridge = f"skb{short}"
        self.subnet = -1
        self.hosts: dict[str, Host] = {}
        self._roles = dict(roles)
        self._short = short
        self._children: list[subprocess.Popen[Any]] = []

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    @property
    def gateway(self) -> str:
        return f"10.88.{self.subnet}.1"

    # -- lifecycle --------------------------------------------------------------------
    def create(self) -> Topology:
        """Make the bridge and the namespaces; raises NetnsUnavailable when the first
        namespace cannot be made (after which nothing is left behind)."""
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise NetnsUnavailable(f"`{tool}` not found (iproute2)")
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        reap_stale()
        probe = f"{self.tag}-probe"
        made = sh("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            raise NetnsUnavailable(f"`ip netns add` failed: {made.stderr.strip()}")
        sh("ip", "netns", "del", probe, check=False)
        free = sorted(set(range(1, 255)) - _used_subnets())
        if not free:
            raise RuntimeError("no free 10.88.X.0/24 subnet")
        self.subnet = random.choice(free)
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "link", "set", self.bridge, "alias", self.tag)
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for i, (role, num) in enumerate(self._roles.items()):
                self._add_host(i, role, num)
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_host(self, i: int, role: str, num: int) -> None:
        host = Host(
            role=role,
            netns=f"{self.tag}-{role}",
            address=f"10.88.{self.subnet}.{num}",
            veth=f"sk{self._short}h{i}",
        )
        peer = f"sk{self._short}p{i}"
        self.hosts[role] = host
        sh("ip", "netns", "add", host.netns)
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", host.veth, "alias", self.tag)
        sh("ip", "link", "set", peer, "netns", host.netns)
        sh("ip", "link", "set", host.veth, "master", self.bridge)
        sh("ip", "link", "set", host.veth, "up")
        inside = ["ip", "netns", "exec", host.netns]
        sh(*inside, "ip", "link", "set", peer, "name", "eth0")
        sh(*inside, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
        sh(*inside, "ip", "link", "set", "eth0", "up")
        sh(*inside, "ip", "link", "set", "lo", "up")

    def popen(self, role: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in a namespace; :meth:`destroy` kills and reaps it."""
        proc: subprocess.Popen[Any] = subprocess.Popen(self[role].cmd(*argv), **kwargs)
        self._children.append(proc)
        return proc

    def track(self, proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        """``proc``, started outside the namespaces: :meth:`destroy` kills and reaps it too."""
        self._children.append(proc)
        return proc

    def kill_all(self, timeout: float = 15.0) -> dict[str, list[int]]:
        """SIGKILL every process of every namespace and reap our children; returns,
        by role, the pids that survived (empty when all died)."""
        left = {}
        for role, host in self.hosts.items():
            survivors = kill_pids(host.pids, timeout)
            if survivors:
                left[role] = survivors
        for proc in self._children:
            if proc.poll() is None:  # (one of the root namespace's: see track)
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):  # unflushed input to a dead process
                        pipe.close()
        return left

    def destroy(self) -> list[str]:
        """Kill everything and delete namespaces, veths and the bridge; returns the
        problems met (never raises)."""
        problems = []
        try:
            left = self.kill_all()
            if left:
                problems.append(f"processes would not die: {left}")
        except Exception as exc:
            problems.append(f"killing: {exc!r}")
        for host in self.hosts.values():
            for argv in (("ip", "netns", "del", host.netns), ("ip", "link", "del", host.veth)):
                with contextlib.suppress(Exception):
                    sh(*argv, check=False)
        with contextlib.suppress(Exception):
            sh("ip", "link", "del", self.bridge, check=False)
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                if os.path.exists(f"/run/netns/{host.netns}"):
                    problems.append(f"namespace {host.netns} still exists")
        with contextlib.suppress(Exception):
            if sh("ip", "link", "show", self.bridge, check=False).returncode == 0:
                problems.append(f"bridge {self.bridge} still exists")
        return problems


def tc_qdiscs(dev: str, netns: str | None = None) -> list[dict[str, Any]]:
    """``tc -s -j qdisc show dev DEV`` (in ``netns`` if given), parsed."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = sh(*prefix, "tc", "-s", "-j", "qdisc", "show", "dev", dev).stdout
    return list(json.loads(out)) if out.strip() else []


@contextlib.contextmanager
def topology(roles: Mapping[str, int]) -> Any:
    """A created :class:`Topology` of ``roles`` for a test, destroyed after it (a problem
    at teardown fails the test). Skips without root or namespaces, but fails where CI
    is set and we are root: there they must work."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces (ip netns), veth, a bridge, tc")
    topo = Topology(roles)
    unavailable = None
    try:
        topo.create()
    except NetnsUnavailable as exc:
        unavailable = str(exc)
    if unavailable is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and we are root, but {unavailable}", pytrace=False)
        pytest.skip(f"network namespaces unavailable: {unavailable}")
    try:
        yield topo
    finally:
        problems = topo.destroy()
    assert not problems, f"netns teardown: {problems}"

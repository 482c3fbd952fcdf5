"""Hosts of their own on one machine: network namespaces on a private bridge, each with its own /tmp and disk
(issue #49).

Every multi-node test before this ran its Ray nodes on one host's loopback, sharing one filesystem. Here each host
is a network namespace with one address on a bridge the harness makes, and a mount namespace of its own whose /tmp
is a folder of the harness's (so a host's sockets, Ray session and local run roots are its alone, and readable from
outside after the fact). The bridge gets no default route and no NAT: nothing on it reaches anything but the hosts
the harness made. Root only (`available()` says why not otherwise).

    with Hosts(3, scratch) as hosts:           # a head and two workers
        head = hosts[0]
        head.popen(["ray", "start", "--head", f"--node-ip-address={head.address}", ...])
        hosts[1].run(["python", "-c", "..."])  # in host 1's namespaces, its /tmp
        hosts.kill(1)                          # every process of host 1 killed, its link down: a host that died

`close()` (the context's exit) kills every process of every host, deletes the namespaces and the bridge, and
checks that none is left; it runs whatever failed before it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Host", "Hosts", "available", "leftovers", "session_prefix"]

REPO = Path(__file__).resolve().parents[2]
PREFIX = "lvh"
HOST_ENV_DROPPED = ("RAY_", "PYTEST_")
"""Variables a host does not inherit from the test process: a real node's shell has neither."""
"""Every bridge, namespace and veth the harness makes starts with this, then the test session's tag."""


def _cgroups() -> str:
    """Shell lines mounting the machine's cgroup hierarchies again under a host's own /sys: `ip netns exec` mounts
    a /sys of the namespace's without them, and slurmd refuses to start without them. v2 where the machine has v2,
    else each v1 controller."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "mount -t cgroup2 cgroup2 /sys/fs/cgroup || true"
    return "\n".join([
        "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup || true",
        "for c in $(awk 'NR > 1 && $4 == 1 { print $1 }' /proc/cgroups); do",
        "  mkdir -p /sys/fs/cgroup/$c",
        "  mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c",
        "done",
        "mkdir -p /sys/fs/cgroup/systemd",
        "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd || true"])


def session_prefix() -> str:
    """`PREFIX` and this test session's tag (`LONGEVAL_HOSTS_TAG`, which tests/conftest.py sets for the session and
    its workers): what `leftovers` looks for, so two sessions on one machine do not count each other's hosts."""
    return PREFIX + os.environ.get("LONGEVAL_HOSTS_TAG", "")


def available() -> str | None:
    """None when this machine can make hosts, else why not (a test skips with it)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"{PREFIX}probe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    mounted = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, text=True)
    if mounted.returncode != 0:
        return f"a mount namespace cannot mount here: {mounted.stderr.strip()}"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no address or route of this machine uses."""
    used = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{uuid.uuid4().int % 200 + 50}.{uuid.uuid4().int % 250}.0/24")
        if str(net.network_address).rsplit(".", 1)[0] + "." not in used:
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the hosts' bridge")


@dataclass
class Host:
    """One host: its network namespace and address, and a holder process whose mount namespace (a private /tmp,
    bound to `disk`) every command of the host joins."""

    name: str
    address: str
    disk: Path
    veth: str
    holder: subprocess.Popen[bytes] | None = None
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` inside this host: its network and mount namespaces."""
        assert self.holder is not None, f"{self.name} is not up"
        return ["nsenter", f"--net=/run/netns/{self.name}", f"--mount=/proc/{self.holder.pid}/ns/mnt",
                f"--uts=/proc/{self.holder.pid}/ns/uts", "--", *argv]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment as a host's command gets it: its temp folder is the host's /tmp, and
        nothing of this process's own Ray or pytest comes along.

        A pytest worker that ran an in-process Ray test has `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` set (see
        `ray_runtime.init_ray`); a host's `ray start --head` that inherits it binds 127.0.0.1 and never answers
        at the host's address (what made the module fail inside `make test`'s workers).
        """
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(HOST_ENV_DROPPED)}
        return {**inherited, "TMPDIR": "/tmp", **(extra or {})}

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(argv), env=self.env(env), capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done

    def popen(self, argv: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None
              ) -> subprocess.Popen[bytes]:
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(self.command(argv), env=self.env(env), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            if log is not None:
                out.close()
        self.started.append(proc)
        return proc

    def kill(self) -> list[int]:
        """This host dies: SIGKILL to every process in it (its holder, which keeps its namespaces, aside), and its
        link goes down. Returns the pids killed."""
        self.link(False)
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # gone, and those this process started reaped
            for proc in self.started:
                proc.poll()
            if not self.processes():
                break
            time.sleep(0.05)
        return pids

    def processes(self) -> list[int]:
        """The processes running in this host, its holder aside."""
        return [p for p in self.pids() if self.holder is None or p != self.holder.pid]

    def link(self, up: bool) -> None:
        """This host's network link up, or down (its processes run on, unreachable)."""
        _ip("link", "set", self.veth, "up" if up else "down")

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (its holder included)."""
        done = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]


class Hosts:
    """`n` hosts on a private bridge; see the module docstring."""

    def __init__(self, n: int, scratch: Path, shared: Sequence[Path] = ()) -> None:
        """`shared`: folders every host sees read-only at their own paths (beside the checkout, the venv and
        `LONGEVAL_CACHE`), which matters only for those under /tmp: a host's /tmp is its own."""
        why = available()
        if why:
            raise RuntimeError(f"cannot make hosts here: {why}")
        candidates = [REPO, Path(sys.prefix), Path(os.environ.get("LONGEVAL_CACHE", REPO / ".cache")), *shared]
        resolved = sorted({p.resolve() for p in candidates if p.exists()})
        self.shared = [p for p in resolved if p.is_relative_to("/tmp") and p != Path("/tmp")
                       and not any(p != q and p.is_relative_to(q) for q in resolved)]
        tag = f"{session_prefix()}{uuid.uuid4().hex[:4]}"  # 12 characters with a veth's suffix: Linux allows 15
        self.bridge = tag
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.hosts = [Host(name=f"{tag}-{i}", address=str(addresses[i]), disk=scratch / f"host{i}",
                           veth=f"{tag}v{i}") for i in range(n)]
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def _up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            host.disk.mkdir(parents=True, exist_ok=True)
            _ip("netns", "add", host.name)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", host.name, "link", "set", "eth0", "up")
            _ip("-n", host.name, "link", "set", "lo", "up")
            # The holder: mount and UTS namespaces of its own, kept until killed: its hostname is the host's name,
            # /tmp is the host's disk (the checkout, the venv and the model cache bound into it read-only where
            # they lie under /tmp), /dev/shm its own.
            script = ["set -e"]
            for path in self.shared:
                inside = host.disk / path.relative_to("/tmp")
                inside.mkdir(parents=True, exist_ok=True)
                script += [f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(inside))}",
                           f"mount -o remount,bind,ro {shlex.quote(str(inside))}"]
            # Its name resolves to its address, as on a real host (Ray looks its hostname up): an /etc/hosts of
            # its own, bound over the machine's in its mount namespace.
            names = host.disk.parent / f"{host.disk.name}.hosts"
            names.write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n"
                             + "".join(f"{h.address} {h.name}\n" for h in self.hosts if h is not host))
            script += [f"mount --bind {shlex.quote(str(names))} /etc/hosts"]
            # `ip netns exec` mounts a /sys of the namespace's own, without the machine's cgroup tree under it, which
            # a real host has (slurmd refuses to start without it): bound from the machine's root.
            script += [_cgroups()]
            script += [f"hostname {host.name}", f"mount --rbind {shlex.quote(str(host.disk))} /tmp",
                       "mount -t tmpfs -o size=2g tmpfs /dev/shm",
                       "echo up", "exec sleep infinity"]
            host.holder = subprocess.Popen(
                ["ip", "netns", "exec", host.name, "unshare", "--mount", "--uts", "--propagation", "private", "sh",
                 "-c", "\n".join(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            assert host.holder.stdout is not None
            if host.holder.stdout.readline().strip() != b"up":
                raise RuntimeError(f"{host.name}'s mount namespace did not come up: "
                                   f"{host.holder.stderr.read().decode() if host.holder.stderr else ''}")
            # `ip netns exec` execs unshare, which execs sh, which execs sleep: the holder's pid is the namespace's
            host.started.append(host.holder)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self, i: int) -> list[int]:
        """Host `i` dies: SIGKILL to every process in it, and its link goes down. Returns the pids killed."""
        return self.hosts[i].kill()

    def link(self, i: int, up: bool) -> None:
        """Host `i`'s network link down (its processes run on, unreachable) or up again."""
        self.hosts[i].link(up)

    def close(self) -> None:
        for host in self.hosts:
            for pid in host.pids() if os.path.exists(f"/run/netns/{host.name}") else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for proc in host.started:
                if proc.poll() is None:
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        for host in self.hosts:
            while host.pids() and time.monotonic() < deadline:  # killed processes leave the namespace
                time.sleep(0.05)
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)  # its peer goes with it, now
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def leftovers(prefix: str | None = None) -> list[str]:
    """Namespaces and links of this session's hosts still on the machine (a test session ends with none), or of
    one set of hosts (`prefix`: its `Hosts.bridge`): another test worker's hosts may be up meanwhile."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    prefix = session_prefix() if prefix is None else prefix
    found = [n for n in names if n.startswith(prefix)]
    found += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()
              if line.split(":")[1].strip().startswith(prefix)]
    return found

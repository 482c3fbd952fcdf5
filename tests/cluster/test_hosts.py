"""The multi-host harness itself (tests/cluster/hosts.py): hosts that reach each other only, each with its own /tmp,
a host that dies, and nothing left behind. No Ray here: the runs across hosts build on this."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.hosts import Hosts, available, leftovers

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no hosts here: {available()}")

SERVE = """
import functools, http.server, sys
class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass
handler = functools.partial(Handler, directory="/tmp")  # the host's own /tmp
http.server.ThreadingHTTPServer((sys.argv[1], 8000), handler).serve_forever()
"""
FETCH = """
import sys, time, urllib.request
deadline = time.monotonic() + 30
while True:
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode(), end="")
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
"""
REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 8000), timeout=2).close()
    print("reached")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_hosts_reach_each_other_keep_their_own_tmp_and_leave_nothing(tmp_path: Path) -> None:
    with Hosts(3, tmp_path / "hosts") as hosts:
        head, worker, other = hosts[0], hosts[1], hosts[2]
        assert len({h.address for h in hosts.hosts}) == 3 and not head.address.startswith("127.")
        assert [h.run(["hostname"]).stdout.strip() for h in hosts.hosts] == [h.name for h in hosts.hosts]
        # each host's /tmp is its own disk, seen from here under the harness's folder, and no other host's
        head.run(["sh", "-c", "echo head > /tmp/mine"])
        assert (head.disk / "mine").read_text() == "head\n"
        assert worker.run(["sh", "-c", "cat /tmp/mine || echo none"]).stdout == "none\n"
        assert not Path("/tmp/mine").exists()
        # the checkout and its venv are there, read-only, even when they lie under /tmp
        code = worker.run([sys.executable, "-c", "import longeval, tests.cluster.hosts; print('ok')"],
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert code.stdout == "ok\n"
        # a server on one host answers another host at its address; the bridge has no address of this machine's
        # and no route out (nothing on it reaches anything but the hosts)
        head.popen([sys.executable, "-c", SERVE, head.address], env={"PYTHONDONTWRITEBYTECODE": "1"})
        page = worker.run([sys.executable, "-c", FETCH, f"http://{head.address}:8000/mine"]).stdout
        assert page == "head\n"
        assert subprocess.run(["ip", "-4", "addr", "show", "dev", hosts.bridge], capture_output=True,
                              text=True).stdout.count("inet ") == 0
        assert "default" not in worker.run(["ip", "route"]).stdout
        # a host that dies: every process of it killed, its link down; the others go on and cannot reach it
        killed = hosts.kill(0)
        assert killed and head.pids() == [head.holder.pid]
        assert other.run([sys.executable, "-c", REACH, head.address]).stdout.strip() != "reached"
        assert worker.run([sys.executable, "-c", REACH, other.address]).stdout.strip() == "ConnectionRefusedError"
    assert leftovers(hosts.bridge) == []  # this test's: another worker's hosts may be up

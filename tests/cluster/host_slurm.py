"""Slurm on the multi-host harness's hosts (issue #49 part 7): slurmctld on one host, a slurmd on each node host,
so `sbatch --nodes=N cluster/slurm/longeval.sbatch` runs its multi-node path as on a real allocation: the batch
step on the first node (the Ray head and the driver), `srun` steps on the others (the Ray workers).

Each daemon runs in its host (its address, its /tmp for spool, state, pid and log files); the configuration is
in a folder every host sees (`Hosts(..., shared=[folder])`). auth/none and cred/none, as in the single-node
Slurm of tests/cluster/test_slurm.py (no munge); proctrack/pgid, so a job's processes end with it.

    conf = scratch / "slurm"; conf.mkdir()
    with Hosts(4, scratch / "hosts", shared=[conf]) as hosts:
        slurm = start_slurm(hosts[3], hosts[:3], conf, cpus=2)
        done = slurm.sbatch("model=tiny_random", ..., nodes=3, env={...})
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.cluster_helpers import SLURM_CONF_COMMON
from tests.cluster.hosts import REPO, Host

__all__ = ["SBIN_PATH", "HostSlurm", "slurm_missing", "start_slurm"]

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel", "squeue")
SBATCH_SCRIPT = REPO / "cluster" / "slurm" / "longeval.sbatch"


def slurm_missing() -> str | None:
    """Why Slurm cannot run here, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool, path=SBIN_PATH) is None]
    return f"Slurm is not installed (no {', '.join(missing)}): `make system` installs slurm-wlm" if missing else None


def _conf(ctl: Host, nodes: list[Host], cpus: int, memory_mb: int) -> str:
    names = ",".join(n.name for n in nodes)
    node_lines = "".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN\n"
                         for n in nodes)
    return f"""\
ClusterName=longevalhosts
SlurmctldHost={ctl.name}({ctl.address})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=/tmp/slurm/state
SlurmdSpoolDir=/tmp/slurm/spool
SlurmctldPidFile=/tmp/slurm/slurmctld.pid
SlurmdPidFile=/tmp/slurm/slurmd.pid
SlurmctldLogFile=/tmp/slurm/slurmctld.log
SlurmdLogFile=/tmp/slurm/slurmd.log
{SLURM_CONF_COMMON}{node_lines}PartitionName=hosts Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class HostSlurm:
    """slurmctld on `ctl`, a slurmd on each of `nodes`; commands run on `ctl` (the login node) by default."""

    ctl: Host
    nodes: list[Host]
    conf: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), "PATH": SBIN_PATH, **(extra or {})}

    def command(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
        return self.ctl.run([shutil.which(argv[0], path=SBIN_PATH) or argv[0], *argv[1:]], env=self.env(env),
                            timeout=timeout, check=False)

    def sbatch(self, *overrides: str, nodes: int, env: dict[str, str], timeout: float = 900
               ) -> tuple[subprocess.CompletedProcess[str], str]:
        """`sbatch --wait --nodes=NODES` of the real script from the login host; returns sbatch's process and the
        job's log (written on the first node, in its /tmp)."""
        done = self.command("sbatch", "--wait", f"--nodes={nodes}", "--time=15", "--output=/tmp/slurm-%j.out",
                            f"--chdir={REPO}", str(SBATCH_SCRIPT), *overrides, env=env, timeout=timeout)
        logs = sorted(self.nodes[0].disk.glob("slurm-*.out"))
        return done, logs[-1].read_text(errors="replace") if logs else ""

    def logs(self) -> str:
        return "\n".join(f"--- {h.name} {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for h in [self.ctl, *self.nodes] for p in sorted((h.disk / "slurm").glob("*.log")))


def start_slurm(ctl: Host, nodes: list[Host], conf_dir: Path, *, cpus: int, memory_mb: int = 4096,
                timeout_s: float = 60) -> HostSlurm:
    """The daemons started, returning once every node is idle. `conf_dir`: a folder every host sees (passed
    to `Hosts` as shared)."""
    why = slurm_missing()
    if why:
        raise RuntimeError(why)
    conf = conf_dir / "slurm.conf"
    conf.write_text(_conf(ctl, nodes, cpus, memory_mb))
    slurm = HostSlurm(ctl, nodes, conf)
    for host, argv in [(ctl, ["slurmctld", "-D", "-i", "-f", str(conf)]),
                       *((n, ["slurmd", "-D", "-N", n.name, "-f", str(conf)]) for n in nodes)]:
        (host.disk / "slurm" / "state").mkdir(parents=True, exist_ok=True)
        (host.disk / "slurm" / "spool").mkdir(parents=True, exist_ok=True)
        host.popen([shutil.which(argv[0], path=SBIN_PATH) or argv[0], *argv[1:]], env=slurm.env(),
                   log=host.disk / "slurm" / f"{argv[0]}.out")
    deadline = time.monotonic() + timeout_s
    states: list[str] = []
    while time.monotonic() < deadline:
        states = slurm.command("sinfo", "-h", "-N", "-o", "%T").stdout.split()
        if len(states) == len(nodes) and set(states) == {"idle"}:
            return slurm
        time.sleep(0.5)
    raise RuntimeError(f"Slurm did not come up on the hosts (node states {states}):\n{slurm.logs()}")

"""cluster/slurm/longeval.sbatch's multi-node path on Slurm across hosts of their own (issue #49 part 7): slurmctld
and the S3 server on one host, a slurmd on each of three node hosts (tests/cluster/host_slurm.py). `sbatch
--nodes=3` of the real script: the Ray head and the driver on the first node, a Ray worker per other node started
with srun, the suite's replicas on all three, the run written to S3.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.host_cluster import HostS3, start_s3
from tests.cluster.host_slurm import HostSlurm, slurm_missing, start_slurm
from tests.cluster.hosts import Hosts, available

pytestmark = [pytest.mark.skipif(available() is not None, reason=f"no hosts here: {available()}"),
              pytest.mark.skipif(slurm_missing() is not None, reason=str(slurm_missing())),
              pytest.mark.engine, pytest.mark.ray, pytest.mark.cluster, pytest.mark.s3, pytest.mark.slurm]

# Three nodes, one replica each (a logical GPU a node): 18 prompts of SYNC in 3 contexts, one a replica.
SUITE = ["model=tiny_random", "suite=sync_quick", "suite.samples=3", "suite.shard_size=3",
         "suite.params.sync.max_new_tokens=8", "cluster.replicas=3", "cluster.gpus_per_replica=1"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path
          ) -> Iterator[tuple[Hosts, HostS3, HostSlurm]]:
    scratch = tmp_path_factory.mktemp("slurm-hosts")
    conf = scratch / "conf"
    conf.mkdir()
    with Hosts(4, scratch / "hosts", shared=[conf]) as hosts:
        s3 = start_s3(hosts[3])
        yield hosts, s3, start_slurm(hosts[3], [hosts[0], hosts[1], hosts[2]], conf, cpus=2)


def test_sbatch_on_three_nodes_starts_ray_across_them_and_the_suite_runs_on_all_three(slurm):
    """Part 7: the batch step on the first node starts the head, srun a worker on each other node (each node's
    processes in its own host), the job waits for three nodes, submits the suite, and exits with its code;
    every prompt is answered once and each node's replica wrote its engine record from its own host."""
    hosts, s3, cluster = slurm
    env = {**s3.env(), "LONGEVAL_REPO": str(Path(__file__).resolve().parents[2]),
           "LONGEVAL_VENV": sys.prefix,
           "LONGEVAL_GPUS_PER_NODE": "1", "LONGEVAL_CPUS_PER_NODE": "2", "LONGEVAL_RAY_WAIT_TIMEOUT": "180",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "LONGEVAL_CACHE": os.environ["LONGEVAL_CACHE"]}
    done, log = cluster.sbatch(*SUITE, f"store.root=s3://{s3.bucket}/runs", "run_name=slurm", nodes=3, env=env)
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{log[-6000:]}\n{cluster.logs()}"
    names = [h.name for h in hosts.hosts[:3]]
    assert f"3 node(s) ({' '.join(names)})" in log, log[-3000:]
    got = _read(hosts, s3)
    assert len(got["instance_id"]) == len(set(got["instance_id"])) == 18
    assert sorted(got["engine_hosts"]) == sorted(names), got["engine_hosts"]
    assert len(set(got["replica"])) == 3


ENGINES = """
import json, sys
from longeval.records import PREDICTION_SCHEMA
from longeval.store.run_root import RunRoot
root = RunRoot(sys.argv[1])
preds = root.read_stage("predictions", PREDICTION_SCHEMA)
records = [root.read_json(f"engines/{n}") for n in root.files("engines")]
print(json.dumps({"instance_id": preds["instance_id"].to_pylist(), "replica": preds["replica"].to_pylist(),
                  "engine_hosts": [r["host"] for r in records]}))
"""


def _read(hosts: Hosts, s3: HostS3) -> dict:
    done = hosts[3].run([sys.executable, "-c", ENGINES, f"s3://{s3.bucket}/runs/slurm"],
                        env={**s3.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])

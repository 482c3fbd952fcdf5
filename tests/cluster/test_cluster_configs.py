"""The cluster files that no test runs for real (an AWS autoscaler config, a KubeRay RayCluster) have the shape
Ray and KubeRay need; the runtime_env leaves the big folders behind; the scripts parse and say what they read;
and the process sweep that stops a cluster finds exactly the processes of that cluster. No Ray cluster here."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from longeval.cluster.launch import free_ports, runtime_env, sweep, tagged_pids
from tests.cluster.cluster_helpers import RAY_CLUSTER_SH, REPO, SBATCH_SCRIPT, new_tag

AUTOSCALER = REPO / "cluster" / "ray" / "autoscaler.yaml"
KUBERAY = REPO / "cluster" / "kuberay" / "raycluster.yaml"
RUNTIME_ENV = REPO / "cluster" / "runtime_env.yaml"


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


# -- the autoscaler config ---------------------------------------------------------------------------


def test_autoscaler_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import validate_config

    validate_config(copy.deepcopy(_load(AUTOSCALER)))  # Ray's JSON schema plus its cross-field checks


def test_autoscaler_config_has_gpu_workers_and_installs_the_gpu_extra():
    config = _load(AUTOSCALER)
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) > 0}
    assert {"a100_80gb", "a40_48gb"} <= set(gpu_types)
    for node_type in gpu_types.values():
        assert node_type["min_workers"] == 0 and node_type["max_workers"] >= 1
        assert node_type["node_config"]["InstanceType"]
    assert any('-e ".[gpu]"' in command for command in config["setup_commands"])
    assert config["file_mounts"] == {"~/longeval": "."}
    assert {".venv", ".cache", "runs"} <= set(config["rsync_exclude"])
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--head" in head_start and "--autoscaling-config" in head_start and "RAY_AUTH_MODE=" in head_start
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(config["worker_start_ray_commands"])


# -- the KubeRay RayCluster --------------------------------------------------------------------------


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def test_kuberay_raycluster_has_the_keys_kuberay_needs():
    cluster = _load(KUBERAY)
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    assert cluster["metadata"]["name"]
    spec = cluster["spec"]
    assert spec["rayVersion"] == ray.__version__  # the image's Ray must match the one that submits
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        # KubeRay's rayStartParams is map[string]string: a bare number or boolean is rejected
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["rayStartParams"]
        volumes = {v["name"] for v in group["template"]["spec"].get("volumes", [])}
        for container in _containers(group):
            assert container["name"] and container["image"]
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
            assert {m["name"] for m in container["volumeMounts"]} <= volumes


def test_kuberay_gpu_worker_groups_ask_kubernetes_and_ray_for_the_same_gpus():
    workers = _load(KUBERAY)["spec"]["workerGroupSpecs"]
    assert {w["groupName"] for w in workers} == {"a100-80gb", "a40-48gb"}
    for group in workers:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        gpus = int(group["rayStartParams"]["num-gpus"])
        assert gpus > 0
        (container,) = _containers(group)
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == gpus
        assert group["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]


# -- the job's runtime_env ---------------------------------------------------------------------------


def test_runtime_env_leaves_the_venv_caches_and_runs_behind(tmp_path):
    from ray._private.runtime_env.packaging import create_package

    env = runtime_env(RUNTIME_ENV, [])
    package = tmp_path / "package.zip"
    # without .gitignore: the excludes alone must keep the upload small
    create_package(str(REPO), package, include_gitignore=False, excludes=env["excludes"])
    names = zipfile.ZipFile(package).namelist()
    assert {"jobs/run.py", "conf/config.yaml", "longeval/run/pipeline.py", "cluster/ray_cluster.sh"} <= set(names)
    assert not [n for n in names if n.split("/")[0] in {".venv", ".cache", "runs", ".git"} or "__pycache__" in n]
    assert package.stat().st_size < 20 * 2**20


def test_runtime_env_adds_the_named_variables_that_are_set():
    env = runtime_env(RUNTIME_ENV, ["LONGEVAL_CACHE", "HF_HUB_OFFLINE", "NOT_SET"],
                      environ={"LONGEVAL_CACHE": "/shared/cache", "HF_HUB_OFFLINE": "1", "OTHER": "x"})
    assert env["env_vars"] == {"TOKENIZERS_PARALLELISM": "false", "MALLOC_ARENA_MAX": "2",
                               "LONGEVAL_CACHE": "/shared/cache", "HF_HUB_OFFLINE": "1"}
    assert env["excludes"]


# -- the scripts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", [RAY_CLUSTER_SH, SBATCH_SCRIPT], ids=lambda p: p.name)
def test_script_parses_and_documents_every_variable_it_reads(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    header = text.split("set -euo pipefail")[0] if script == SBATCH_SCRIPT else text.split("# shellcheck shell")[0]
    body = text[len(header):]
    read = set(re.findall(r"\$\{?(LONGEVAL_[A-Z_]+)", body))
    undocumented = sorted(name for name in read if name not in header)
    assert not undocumented, f"{script.name} reads {undocumented} without saying so at the top"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="no shellcheck (apt-get install shellcheck)")
def test_scripts_are_shellcheck_clean():
    result = subprocess.run(["shellcheck", "-x", str(RAY_CLUSTER_SH.relative_to(REPO)),
                             str(SBATCH_SCRIPT.relative_to(REPO))], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_sbatch_script_says_how_many_nodes_and_one_task_per_node():
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SBATCH_SCRIPT.read_text(), re.M))
    assert directives["nodes"] == "1" and directives["ntasks-per-node"] == "1"
    assert "exclusive" in directives and directives["signal"].startswith("B:TERM@")


# -- finding a cluster's processes -------------------------------------------------------------------


def test_free_ports_are_distinct():
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(1024 < p < 65536 for p in ports)


def test_sweep_stops_the_tagged_processes_and_nothing_older_or_untagged():
    tag = new_tag()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    older = subprocess.Popen(sleep, env={**os.environ, "LONGEVAL_RAY_TAG": tag})
    time.sleep(0.1)  # start times count in clock ticks (10 ms)
    marker = subprocess.Popen(sleep)
    time.sleep(0.1)
    try:
        # the marker stands in for the script that set the tag: what started before it is left alone
        younger = subprocess.Popen(sleep, env={**os.environ, "LONGEVAL_RAY_TAG": tag}, start_new_session=True)
        other = subprocess.Popen(sleep, env={**os.environ, "LONGEVAL_RAY_TAG": new_tag()})
        try:
            assert tagged_pids(tag) == sorted([older.pid, younger.pid])
            assert tagged_pids(tag, since_pid=marker.pid) == [younger.pid]
            assert list(sweep(tag, since_pid=marker.pid, grace_s=5)) == [younger.pid]
            assert younger.wait(timeout=10) == -15
            assert older.poll() is None and other.poll() is None
        finally:
            for process in (younger, other):
                process.kill()
                process.wait()
    finally:
        for process in (older, marker):
            process.kill()
            process.wait()

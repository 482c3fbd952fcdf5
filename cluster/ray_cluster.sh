#!/usr/bin/env bash
# A Ray cluster for one longeval job: start the head (and workers), wait until every node and its CPUs and
# GPUs have joined, submit `python jobs/run.py run OVERRIDES` with `ray job submit` (its logs stream here), and
# stop exactly the processes this cluster started. cluster/slurm/longeval.sbatch is built on it; it also runs
# by hand.
#
# By hand, on one machine (Ray on loopback, free ports, its own temp dir; exits with the job's exit code):
#   cluster/ray_cluster.sh run model=tiny_random suite=quick store.root=/tmp/runs
# Against a cluster that is already running (`ray start`, the autoscaler, KubeRay):
#   RAY_ADDRESS=http://HEAD:8265 cluster/ray_cluster.sh submit model=llama31_8b suite=ruler store.root=s3://b/runs
# As a library: `source cluster/ray_cluster.sh`, then rc_activate, rc_configure HEAD_IP, rc_start_head,
# rc_start_worker, rc_wait, rc_submit, with `trap rc_cleanup EXIT` (see cluster/slurm/longeval.sbatch).
#
# Environment (all optional):
#   LONGEVAL_REPO         the checkout uploaded as the job's working_dir (default: the one holding this file)
#   LONGEVAL_ACTIVATE     a shell command run first to get python and ray on PATH, e.g.
#                         "module load cuda/12.4 && source /shared/venvs/longeval/bin/activate"
#   LONGEVAL_VENV         a virtualenv to use when LONGEVAL_ACTIVATE is not set (default: $LONGEVAL_REPO/.venv if
#                         there is one, else whatever is on PATH)
#   LONGEVAL_RAY_HEAD_IP  address the head binds and advertises (`run`: 127.0.0.1)
#   LONGEVAL_RAY_PORT, LONGEVAL_RAY_DASHBOARD_PORT, LONGEVAL_RAY_CLIENT_PORT, LONGEVAL_RAY_AGENT_PORT
#                         GCS, dashboard/job API, Ray client and dashboard-agent ports (default: free ports, so
#                         two clusters on one node never clash; Ray's own defaults 6379/8265/10001/52365 would)
#   LONGEVAL_RAY_DASHBOARD_HOST  where the dashboard listens (default: the head address)
#   LONGEVAL_RAY_TMPDIR   Ray's --temp-dir (default /tmp/ray-le-TAG). Keep it short: Ray's socket paths below it
#                         must fit AF_UNIX's 107 bytes. Removed after a successful run, kept after a failure.
#   LONGEVAL_RAY_START_ARGS  extra `ray start` arguments, e.g. "--object-store-memory=4000000000"
#   LONGEVAL_RAY_NUM_CPUS, LONGEVAL_RAY_NUM_GPUS  what `run` gives its one node (default: all CPUs, Ray's GPU count)
#   LONGEVAL_RAY_WAIT_TIMEOUT  seconds to wait for the cluster (default 300)
#   LONGEVAL_RAY_STATUS_EVERY  seconds between the cluster waits' `ray status` polls (each a Python process of
#                         about 2 CPU-seconds) until a raylet socket shows in the temp dir on this machine (default 5);
#                         the head's appears there just before its node registers, and from then on they run every
#                         2 s. A head whose temp dir this machine cannot see (a container's /tmp) is polled every
#                         LONGEVAL_RAY_STATUS_EVERY s throughout
#   LONGEVAL_RAY_STOP_TIMEOUT  seconds for the nodes to stop after SIGTERM before SIGKILL (default 60)
#   LONGEVAL_RAY_TAG      marks this cluster's processes for the final sweep (default: random)
#   LONGEVAL_RUNTIME_ENV  runtime_env YAML for the job (default: cluster/runtime_env.yaml)
#   LONGEVAL_JOB_ENV      names of variables copied into the job's env_vars when set (`run` and Slurm: the list
#                         in RC_DEFAULT_JOB_ENV below; `submit`: none, as paths on this machine need not exist on a
#                         remote cluster). Never secrets: the cluster keeps a job's runtime_env, its dashboard shows it
#   LONGEVAL_JOB_ID       the job's submission id (default longeval-TAG-DATE)
#   LONGEVAL_JOB_PYTHON   the job's interpreter (default: python, i.e. the one on the head node's PATH)
#   RAY_AUTH_MODE         default "disabled" for `ray start` and every client call (Ray 2.60 turns token auth on by
#                         default and a plain `ray job submit` then fails). "token" works too: set RAY_AUTH_TOKEN
#                         (or RAY_AUTH_TOKEN_PATH) or one is generated and exported to every node of this cluster.
#
# shellcheck shell=bash

RC_SELF_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RC_DEFAULT_JOB_ENV="LONGEVAL_CACHE LONGEVAL_CONF LONGEVAL_LOG LONGEVAL_S3_ENDPOINT HF_HOME HF_HUB_OFFLINE \
TRANSFORMERS_OFFLINE TOKENIZERS_PARALLELISM RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER AWS_REGION AWS_PROFILE \
AWS_ENDPOINT_URL WANDB_MODE WANDB_PROJECT WANDB_ENTITY VLLM_CPU_KVCACHE_SPACE"
# What Ray appends to its temp dir for a socket (session_DATE_PID/sockets/plasma_store), as in longeval.run.pipeline.
RC_SOCKET_SUFFIX=66
RC_PIDS=()
RC_SUBMIT_PID=
RC_JOB_ID=
RC_TMP=
RC_TMP_CREATED=0

rc_log() { printf '[ray_cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Only call in the main shell (not inside $(...)): it ends the script, and with it the EXIT trap's cleanup.
rc_die() {
    rc_log "error: $*"
    exit "${RC_DIE_STATUS:-1}"
}

rc_alive() { [[ -e /proc/$1 ]] && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]; }

rc_any_alive() {
    local pid
    for pid in "$@"; do
        if rc_alive "$pid"; then return 0; fi
    done
    return 1
}

# Put python and ray on PATH: the user's own command, else a virtualenv.
rc_activate() {
    RC_REPO=${LONGEVAL_REPO:-$RC_SELF_REPO}
    if [[ -n ${LONGEVAL_ACTIVATE:-} ]]; then
        rc_log "activating: $LONGEVAL_ACTIVATE"
        # Activation scripts (conda's above all) read unset variables: relax -u while they run.
        set +u
        eval "$LONGEVAL_ACTIVATE"
        set -u
    else
        local venv=${LONGEVAL_VENV:-$RC_REPO/.venv}
        if [[ -x $venv/bin/python ]]; then
            export VIRTUAL_ENV=$venv
            export PATH=$venv/bin:$PATH
        elif [[ -n ${LONGEVAL_VENV:-} ]]; then
            rc_die "LONGEVAL_VENV=$venv has no bin/python"
        fi
    fi
    command -v ray >/dev/null || rc_die "no 'ray' on PATH: set LONGEVAL_VENV or LONGEVAL_ACTIVATE"
    RC_PYTHON=$(command -v python || command -v python3) || rc_die "no python on PATH"
}

# longeval/cluster/launch.py of this checkout, wherever the shell stands and whatever longeval the venv holds.
rc_launch() { PYTHONPATH=$RC_REPO${PYTHONPATH:+:$PYTHONPATH} "$RC_PYTHON" -m longeval.cluster.launch "$@"; }

# Addresses, ports, temp dir and auth for a cluster whose head is at $1 (LONGEVAL_RAY_HEAD_IP wins).
rc_configure() {
    RC_TAG=${LONGEVAL_RAY_TAG:-$(printf '%04x%04x' "$RANDOM" "$RANDOM")}
    [[ $RC_TAG =~ ^[A-Za-z0-9._-]+$ ]] || rc_die "LONGEVAL_RAY_TAG may hold only letters, digits, '.', '_', '-'"
    # Every process started from here on inherits the tag: rc_cleanup finds leftovers by it.
    export LONGEVAL_RAY_TAG=$RC_TAG
    RC_HEAD_IP=${LONGEVAL_RAY_HEAD_IP:-$1}

    RC_TMP=${LONGEVAL_RAY_TMPDIR:-/tmp/ray-le-$RC_TAG}
    if (( ${#RC_TMP} + RC_SOCKET_SUFFIX > 107 )); then
        rc_die "LONGEVAL_RAY_TMPDIR=$RC_TMP is too long (${#RC_TMP} bytes): Ray's socket paths below it would" \
            "exceed AF_UNIX's 107 bytes; use at most $((107 - RC_SOCKET_SUFFIX)) bytes, e.g. /tmp/ray-\$USER"
    fi
    if [[ ! -e $RC_TMP ]]; then RC_TMP_CREATED=1; fi
    mkdir -p "$RC_TMP"

    local free
    read -r -a free <<<"$(rc_launch free-ports 4)"
    (( ${#free[@]} == 4 )) || rc_die "could not pick free ports"
    RC_PORT=${LONGEVAL_RAY_PORT:-${free[0]}}
    RC_DASH_PORT=${LONGEVAL_RAY_DASHBOARD_PORT:-${free[1]}}
    RC_CLIENT_PORT=${LONGEVAL_RAY_CLIENT_PORT:-${free[2]}}
    RC_AGENT_PORT=${LONGEVAL_RAY_AGENT_PORT:-${free[3]}}
    RC_DASH_HOST=${LONGEVAL_RAY_DASHBOARD_HOST:-$RC_HEAD_IP}
    RC_GCS=$RC_HEAD_IP:$RC_PORT
    RC_DASHBOARD_URL=http://$RC_HEAD_IP:$RC_DASH_PORT

    export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
    if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
        # One token for this cluster: every node (srun passes the environment on), the submit and the status polls.
        RAY_AUTH_TOKEN=$("$RC_PYTHON" -c 'import secrets; print(secrets.token_hex(32))')
        export RAY_AUTH_TOKEN
    fi
    # On loopback Ray must not advertise the machine's external address; with 0, though, `ray start --address`
    # refuses to start a worker, so a multi-node cluster needs 1.
    if [[ $RC_HEAD_IP == 127.* ]]; then
        export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    else
        export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1
    fi
    export RAY_USAGE_STATS_ENABLED=0
    # On SIGTERM `ray start --block` first drains its node, for up to 30 s (seen in full after a vLLM job, and
    # whenever the GCS is signalled at the same time, as under Slurm). We stop the cluster only once the job is
    # over, or because the job is being stopped: there is nothing to drain.
    export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
}

# rc_start_head CPUS GPUS [LAUNCHER...]: `ray start --head --block` in the background (through LAUNCHER, e.g.
# srun); an empty CPUS or GPUS lets Ray count them. --block keeps one process per node that owns all of that
# node's Ray processes, so stopping the cluster is a SIGTERM to it.
rc_start_head() {
    local cpus=$1 gpus=$2
    shift 2
    local args=(start --head --block --disable-usage-stats
        --node-ip-address="$RC_HEAD_IP" --port="$RC_PORT"
        --include-dashboard=true --dashboard-host="$RC_DASH_HOST" --dashboard-port="$RC_DASH_PORT"
        --ray-client-server-port="$RC_CLIENT_PORT" --dashboard-agent-listen-port="$RC_AGENT_PORT"
        --temp-dir="$RC_TMP")
    if [[ -n $cpus ]]; then args+=(--num-cpus="$cpus"); fi
    if [[ -n $gpus ]]; then args+=(--num-gpus="$gpus"); fi
    # shellcheck disable=SC2206  # the user's extra arguments are meant to be split into words
    args+=(${LONGEVAL_RAY_START_ARGS:-})
    rc_log "starting the Ray head at $RC_GCS (dashboard $RC_DASHBOARD_URL, temp dir $RC_TMP, tag $RC_TAG)"
    "$@" ray "${args[@]}" &
    RC_PIDS+=("$!")
}

# rc_start_worker CPUS GPUS [LAUNCHER...]: a node joining the head's GCS.
rc_start_worker() {
    local cpus=$1 gpus=$2
    shift 2
    local args=(start --block --disable-usage-stats --address="$RC_GCS"
        --dashboard-agent-listen-port="$RC_AGENT_PORT" --temp-dir="$RC_TMP")
    if [[ -n $cpus ]]; then args+=(--num-cpus="$cpus"); fi
    if [[ -n $gpus ]]; then args+=(--num-gpus="$gpus"); fi
    # shellcheck disable=SC2206  # the user's extra arguments are meant to be split into words
    args+=(${LONGEVAL_RAY_START_ARGS:-})
    rc_log "starting a Ray worker: $*"
    "$@" ray "${args[@]}" &
    RC_PIDS+=("$!")
}

# "NODES CPUS GPUS" as `ray status` reports them. It exits 0 with no nodes while the GCS is still starting, so
# count the lines under "Active:" rather than trusting its exit status.
rc_counts() {
    { ray status --address "$RC_GCS" 2>/dev/null || true; } | awk '
        /^Active:/ { section = "active"; next }
        /^Total Usage:/ { section = "usage"; next }
        /^[^ ]/ || /^$/ { section = "" }
        section == "active" && $1 ~ /^[0-9]+$/ { nodes += $1 }
        section == "usage" && $2 == "CPU" { split($1, have, "/"); cpus = have[2] }
        section == "usage" && $2 == "GPU" { split($1, have, "/"); gpus = have[2] }
        END { printf "%d %d %d\n", nodes, cpus, gpus }'
}

# Whether a raylet of this cluster listens on this machine: its socket under our temp dir (the head's, when it
# runs here). Checked instead of `ray status` until it is there.
rc_raylet_here() { compgen -G "$RC_TMP/session_*/sockets/raylet*" >/dev/null; }

# rc_wait NODES [CPUS] [GPUS]: until the cluster has at least that much, a `ray start` dies, or the timeout.
rc_wait() {
    local want_nodes=$1 want_cpus=${2:-0} want_gpus=${3:-0}
    local timeout=${LONGEVAL_RAY_WAIT_TIMEOUT:-300} started=$SECONDS nodes=0 cpus=0 gpus=0
    local every=${LONGEVAL_RAY_STATUS_EVERY:-5} polled=$SECONDS
    rc_log "waiting for $want_nodes node(s), $want_cpus CPUs, $want_gpus GPUs (up to $timeout s)"
    while true; do
        if rc_raylet_here || (( SECONDS - polled >= every )); then
            polled=$SECONDS
            read -r nodes cpus gpus <<<"$(rc_counts)"
            if (( nodes >= want_nodes && cpus >= want_cpus && gpus >= want_gpus )); then
                rc_log "Ray cluster is up: $nodes node(s), $cpus CPUs, $gpus GPUs after $((SECONDS - started)) s"
                return 0
            fi
        fi
        local pid
        for pid in "${RC_PIDS[@]}"; do
            rc_alive "$pid" || rc_die "'ray start' (pid $pid) exited before the cluster was up; its output is above"
        done
        if (( SECONDS - started >= timeout )); then
            rc_die "the Ray cluster did not come up within $timeout s: $nodes/$want_nodes nodes," \
                "$cpus/$want_cpus CPUs, $gpus/$want_gpus GPUs"
        fi
        if rc_raylet_here; then sleep 2; else sleep 0.5; fi
    done
}

# rc_submit OVERRIDES...: run `jobs/run.py run OVERRIDES` as a Ray job, streaming its logs; returns the
# evaluation's exit code (not `ray job submit`'s, which is 1 for any failure).
rc_submit() {
    RC_JOB_ID=${LONGEVAL_JOB_ID:-longeval-$RC_TAG-$(date +%Y%m%d-%H%M%S)}
    local runtime_env
    runtime_env=$(rc_launch runtime-env "${LONGEVAL_RUNTIME_ENV:-$RC_REPO/cluster/runtime_env.yaml}" \
        "${LONGEVAL_JOB_ENV-$RC_DEFAULT_JOB_ENV}") || rc_die "could not build the job's runtime_env"
    rc_log "submitting job $RC_JOB_ID to $RC_DASHBOARD_URL: ${LONGEVAL_JOB_PYTHON:-python} jobs/run.py run $*"
    # In the background and waited for: a SIGTERM (scancel, the time limit) then reaches the trap at once.
    ray job submit --address "$RC_DASHBOARD_URL" --submission-id "$RC_JOB_ID" --working-dir "$RC_REPO" \
        --runtime-env-json "$runtime_env" -- "${LONGEVAL_JOB_PYTHON:-python}" jobs/run.py run "$@" &
    RC_SUBMIT_PID=$!
    local submit_status=0
    wait "$RC_SUBMIT_PID" || submit_status=$?
    RC_SUBMIT_PID=
    local code
    code=$(rc_launch job-exit-code "$RC_DASHBOARD_URL" "$RC_JOB_ID" "$submit_status") || code=1
    rc_log "job $RC_JOB_ID finished with exit code $code"
    return "$code"
}

# SIGTERM every `ray start --block` and wait for them (each drains its node and stops that node's Ray processes),
# then sweep what carries our tag. Never `ray stop`: it stops every Ray cluster on the machine, and leaves a
# backgrounded `ray start --block` up. A launcher that does not pass SIGTERM on (srun SIGKILLs its tasks on one)
# sets RC_SIGNAL_NODES to a function that delivers it; RC_PIDS are waited for either way.
rc_signal_pids() { kill -TERM "${RC_PIDS[@]}" 2>/dev/null || true; }

rc_stop() {
    if (( ${#RC_PIDS[@]} )); then
        local timeout=${LONGEVAL_RAY_STOP_TIMEOUT:-60}
        local deadline=$((SECONDS + timeout))
        rc_log "stopping Ray: SIGTERM to ${RC_PIDS[*]}"
        "${RC_SIGNAL_NODES:-rc_signal_pids}"
        while rc_any_alive "${RC_PIDS[@]}" && (( SECONDS < deadline )); do sleep 0.5; done
        if rc_any_alive "${RC_PIDS[@]}"; then
            rc_log "Ray still up after $timeout s: SIGKILL"
            kill -KILL "${RC_PIDS[@]}" 2>/dev/null || true
        fi
        wait "${RC_PIDS[@]}" 2>/dev/null || true
        RC_PIDS=()
    fi
    # The job's driver runs in a session of its own, outside the `ray start` process group. --since-pid: not the
    # processes older than this script that carry the tag because they handed it over (a shell, `sbatch --wait`).
    if [[ -n ${RC_TAG:-} ]]; then rc_launch sweep "$RC_TAG" --since-pid "$$" || true; fi
}

# The EXIT trap: stop a job still running (we were interrupted), stop the cluster, keep the exit status.
rc_cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    if [[ -n $RC_SUBMIT_PID ]]; then
        rc_log "interrupted: stopping job $RC_JOB_ID"
        kill -TERM "$RC_SUBMIT_PID" 2>/dev/null
        timeout 60 ray job stop --address "$RC_DASHBOARD_URL" "$RC_JOB_ID" >/dev/null 2>&1
    fi
    rc_stop
    if (( status == 0 && RC_TMP_CREATED )) && [[ -n $RC_TMP ]]; then
        rm -rf "$RC_TMP"
    elif [[ -n $RC_TMP ]]; then
        rc_log "Ray's logs: $RC_TMP/session_latest/logs"
    fi
    rc_log "done (exit status $status)"
    exit "$status"
}

rc_traps() {
    trap rc_cleanup EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
}

rc_main() {
    set -euo pipefail
    local command=${1:-}
    shift || true
    case $command in
        run)
            rc_activate
            rc_configure 127.0.0.1
            rc_traps
            # setsid: a Ctrl-C in the terminal reaches this script (which stops the cluster in order), not Ray.
            rc_start_head "${LONGEVAL_RAY_NUM_CPUS:-$(nproc)}" "${LONGEVAL_RAY_NUM_GPUS:-}" setsid
            rc_wait 1 "${LONGEVAL_RAY_NUM_CPUS:-$(nproc)}" "${LONGEVAL_RAY_NUM_GPUS:-0}"
            local status=0
            rc_submit "$@" || status=$?
            exit "$status"
            ;;
        submit)
            # A remote cluster has its own paths: pass on only what LONGEVAL_JOB_ENV names.
            export LONGEVAL_JOB_ENV=${LONGEVAL_JOB_ENV:-}
            rc_activate
            RC_DASHBOARD_URL=${RAY_ADDRESS:?set RAY_ADDRESS to the cluster\'s dashboard, e.g. http://head:8265}
            RC_TAG=${LONGEVAL_RAY_TAG:-$(printf '%04x%04x' "$RANDOM" "$RANDOM")}
            export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
            rc_submit "$@"
            ;;
        *)
            sed -n '2,12p' "${BASH_SOURCE[0]}" >&2
            exit 64
            ;;
    esac
}

# Executed (not sourced): the command line above.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    rc_main "$@"
fi

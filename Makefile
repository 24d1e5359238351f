# Resilient Training Job operator. `make` (or `make help`) lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.rtj-installed
NODES ?= 4
PYTEST_ARGS ?=
# Kubelet-node runs use a cluster of their own (the API server reachable from pods), apart from `make test`'s.
KUBELET_RUN_DIR ?= .run/kubelet-e2e
LOCAL_IMAGES := --image localhost/rtj-trainer:cpu-local --image localhost/rtj-operator:local

##@ General

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
		/^[a-zA-Z0-9_.-]+:.*?## / { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup

# Python 3.12, as in the trainer image (pyenv provides it on our machines; PYTHON312=... overrides).
PYTHON312 ?= $(shell for p in python3.12 "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v "$$p"; break; }; done)
# The NVRx we ship, read from its one pin in pyproject.toml (the trainer Dockerfile reads the same pin;
# tests/unit/test_nvrx_pin.py checks both).
NVRX_VERSION := $(shell sed -n 's/^ *"nvidia-resiliency-ext==\([^"]*\)".*/\1/p' pyproject.toml)
# NVRx >= 0.5 publishes only manylinux_2_39 wheels; Debian 12 has glibc 2.36, so plain pip would pick 0.4.1.
# Its only compiled file (the straggler CUPTI extension) is never imported by what we use, so the wheel is
# installed with pip's platform options; its dependencies then come from PyPI with the project's extras.
NVRX_PIP_PLATFORM := --only-binary=:all: --no-deps --implementation cp --python-version 3.12 \
	--platform manylinux_2_39_x86_64

.PHONY: venv
venv: $(VENV_STAMP) ## Create .venv (Python 3.12, NVRx $(NVRX_VERSION), all extras; reused while pyproject.toml is unchanged)

$(VENV_STAMP): pyproject.toml Makefile
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found: install it (pyenv install 3.12) or set PYTHON312" >&2; exit 1; }
	@test -n "$(NVRX_VERSION)" || { echo "no nvidia-resiliency-ext==X pin in pyproject.toml" >&2; exit 1; }
	if [[ -x $(PY) ]] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then \
		echo "$(VENV) is not Python 3.12: recreating it"; rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --upgrade $(NVRX_PIP_PLATFORM) \
		--target "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
		"nvidia-resiliency-ext==$(NVRX_VERSION)"
	$(PY) -m pip install --quiet -e '.[operator,trainer,dev]'
	$(PY) -c 'import importlib.metadata as m; v = m.version("nvidia-resiliency-ext"); \
		assert v == "$(NVRX_VERSION)", v; print("NVRx", v, "in $(VENV)")'
	touch $@

.PHONY: host-prereqs
host-prereqs: ## Install what images and kubelet nodes need from Debian (podman, buildah, debootstrap, runc, CNI plugins, iptables; root)
	hack/install-host-prereqs.sh

##@ Images (podman/buildah, no daemon, no registry)

.PHONY: images
images: host-prereqs ## Build rtj-operator:local and rtj-trainer:cpu-local (base made with debootstrap; cached)
	hack/build-images.sh

##@ Local cluster (etcd, kube-apiserver, controller-manager, scheduler, KWOK on 127.0.0.1)

.PHONY: cluster-build
cluster-build: venv ## Build or reuse the cached binaries (~/.cache/rtj/bin)
	PYTHON=$(PY) hack/build-cluster.sh

.PHONY: nodes-build
nodes-build: venv host-prereqs ## Also build what kubelet nodes run: kubelet, kube-proxy, containerd, CoreDNS, pause (cached)
	PYTHON=$(PY) hack/build-cluster.sh --nodes

.PHONY: cluster-up
cluster-up: cluster-build ## Start the cluster with NODES fake p5.48xlarge nodes (reuses a healthy one)
	$(PY) -m rtj_local.cluster up --nodes $(NODES)

.PHONY: cluster-down
cluster-down: venv ## Stop the cluster
	$(PY) -m rtj_local.cluster down

.PHONY: cluster-status
cluster-status: venv ## Health of each cluster component
	$(PY) -m rtj_local.cluster status

##@ Test

.PHONY: test
test: venv cluster-build ## Run all tests except slow ones (the session fixture starts the cluster)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS) tests/

# The nodes are started (and the 6 GB trainer image loaded into each) before pytest, so that no test's
# timeout counts the loading; everything is stopped afterwards, whatever the outcome. The node agent's own
# tests (test_node_agent.py) are not about the product: they stay in `make test`.
.PHONY: test-e2e-nodes
test-e2e-nodes: venv nodes-build images ## The e2e tier on 4 kubelet nodes (as many as the node-agent tier has): the chart's operator pod and every job pod from `make images` (root)
	export RTJ_RUN_DIR=$(KUBELET_RUN_DIR); \
	trap '$(PY) -m rtj_local.kubelet_nodes down; $(PY) -m rtj_local.cluster down' EXIT; \
	$(PY) -m rtj_local.cluster up --nodes 0 --real-nodes; \
	$(PY) -m rtj_local.kubelet_nodes up --nodes 4 $(LOCAL_IMAGES); \
	RTJ_E2E_NODES=kubelet $(PY) -m pytest -m e2e --ignore=tests/e2e/test_node_agent.py $(PYTEST_ARGS) tests/e2e

.PHONY: test-unit
test-unit: venv ## Run unit tests only (no cluster, no processes)
	$(PY) -m pytest -m unit $(PYTEST_ARGS) tests/

##@ Code quality

.PHONY: lint
lint: venv ## ruff check, ruff format --check, import-linter
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

.PHONY: typecheck
typecheck: venv ## mypy with pydantic's plugin over operator/, trainer-image/ and hack/ (config: pyproject.toml [tool.mypy])
	$(VENV)/bin/mypy

.PHONY: audit
audit: venv cluster-build ## helm lint, kubeconform, kube-score, checkov, hadolint, restricted Pod Security (hack/audit.sh; docs/audit.md)
	hack/audit.sh

.PHONY: generate
generate: venv ## Generate the CRDs (crds/ and the chart's crds/) from the pydantic API models
	$(PY) -m rtj.api.crdgen

.PHONY: verify
verify: lint generate ## lint + generate, then fail if generated files differ from the commit
	git diff --exit-code
	@untracked="$$(git ls-files --others --exclude-standard -- crds charts)"; \
		if [[ -n "$$untracked" ]]; then echo "untracked generated files:"; echo "$$untracked"; exit 1; fi

##@ Demo and benchmarks

# The demo runs the product as users run it (kubelet nodes, our images); the node agent's demo stays as the
# quick look that needs no images (docs/development.md, "How `make demo-agent` works", gives both times).
.PHONY: demo
demo: venv nodes-build images ## The demo on 3 kubelet nodes: helm-installed operator pod, jobs of the trainer image, a node death (root)
	RTJ_RUN_DIR=$(KUBELET_RUN_DIR) $(PY) -m rtj_local.kubelet_demo

.PHONY: demo-agent
demo-agent: venv cluster-build ## The quick demo: pods as host processes of the node agent (no images; root)
	$(PY) -m rtj_local.demo

.PHONY: kueue-demo
kueue-demo: venv cluster-build ## Kueue v0.17 (built from its Go module, ~25 min the first time) admits and queues jobs run by our operator (hack/kueue-probe.sh; docs/kueue.md)
	hack/kueue-probe.sh

.PHONY: gpu-smoke
gpu-smoke: ## On a GPU machine (2 GPUs; SMOKE_ARGS="--nproc 1" on one): the product path (rendezvous + launch -> ft_launcher -> FSDP2 ~1 B) through an in-process and an in-job fault; prints JSON
	$(PY) bench/gpu_smoke.py --out .run/gpu-smoke.json $(SMOKE_ARGS)

.PHONY: bench
bench: venv cluster-build ## Run the benchmarks (bench/run_all.sh)
	@if [[ -x bench/run_all.sh ]]; then bench/run_all.sh; \
	elif [[ -f bench/__main__.py ]]; then $(PY) -m bench; \
	else echo "bench/run_all.sh does not exist yet; run a script under bench/ directly" >&2; exit 1; fi

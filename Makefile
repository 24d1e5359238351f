# Resilient Training Job operator. `make` (or `make help`) lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.rtj-installed
NODES ?= 4
PYTEST_ARGS ?=

##@ General

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
		/^[a-zA-Z0-9_.-]+:.*?## / { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup

.PHONY: venv
venv: $(VENV_STAMP) ## Create .venv with the package and all extras (reused while pyproject.toml is unchanged)

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[operator,trainer,dev]'
	touch $@

##@ Local cluster (etcd, kube-apiserver, controller-manager, scheduler, KWOK on 127.0.0.1)

.PHONY: cluster-build
cluster-build: venv ## Build or reuse the cached binaries (~/.cache/rtj/bin)
	PYTHON=$(PY) hack/build-cluster.sh

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

.PHONY: test-unit
test-unit: venv ## Run unit tests only (no cluster, no processes)
	$(PY) -m pytest -m unit $(PYTEST_ARGS) tests/

##@ Code quality

.PHONY: lint
lint: venv ## ruff check, ruff format --check, import-linter
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

.PHONY: generate
generate: venv ## Generate the CRDs (crds/ and the chart's crds/) from the pydantic API models
	$(PY) -m rtj.api.crdgen

.PHONY: verify
verify: lint generate ## lint + generate, then fail if generated files differ from the commit
	git diff --exit-code
	@untracked="$$(git ls-files --others --exclude-standard -- crds charts)"; \
		if [[ -n "$$untracked" ]]; then echo "untracked generated files:"; echo "$$untracked"; exit 1; fi

##@ Demo and benchmarks

.PHONY: demo
demo: venv cluster-build ## Run the end-to-end demo on the local cluster
	$(PY) -m rtj_local.demo

.PHONY: bench
bench: venv cluster-build ## Run the benchmarks (bench/run_all.sh)
	@if [[ -x bench/run_all.sh ]]; then bench/run_all.sh; \
	elif [[ -f bench/__main__.py ]]; then $(PY) -m bench; \
	else echo "bench/run_all.sh does not exist yet; run a script under bench/ directly" >&2; exit 1; fi

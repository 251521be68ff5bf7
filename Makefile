# mmpe: `make run` (main job) and `make test` (tests) do all set-up on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST  := $(PY) -m pytest
# The tests run on both cores (pytest-xdist), one torch thread per worker: two busy threads per
# core run far slower than one.
XDIST   := -n 2 --dist worksteal
export OMP_NUM_THREADS ?= 1
APT_PKGS := espeak-ng proj-data bowtie2-examples

.PHONY: setup lock run report results test test-train test-slow test-gpu test-floor test-core lint bench docs data-audio apt clean

# Every environment is installed from its lock (requirements/lock.txt; the floor's
# requirements/floor-lock.txt): each package at its tested version, with --no-deps since a lock is
# complete, mmpe editable on top (built with the locked setuptools), and the torch family
# imported together with transformers, so a broken pairing stops here rather than in the tests.
LOCK       := requirements/lock.txt
FLOOR_LOCK := requirements/floor-lock.txt
define install_locked
	python3 -m venv $(1)
	$(1)/bin/python -m pip install -q --no-deps "$$(grep '^pip==' $(2))"
	$(1)/bin/python -m pip install -q --no-deps -r $(2)
	$(1)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	$(1)/bin/python -c "import torch, torchvision, torchaudio, transformers"
endef

$(STAMP): pyproject.toml $(LOCK)
	$(call install_locked,$(VENV),$(LOCK))
	touch $(STAMP)

setup: $(STAMP)

# Refresh both locks from the newest versions the registry serves (under requirements/lock.in;
# the floor's under requirements/floor.txt too), in scratch environments, then run the tests on
# them; prints what moved (for the CHANGELOG). Commit the locks only when both runs pass.
LOCK_EXTRAS := recipes,timm,pyg,hf,fla,data,docs,dev
lock:
	rm -rf .venv-lock .venv-floor-lock
	python3 -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q -c requirements/lock.in setuptools torch torchvision \
		torchaudio -e ".[$(LOCK_EXTRAS)]"
	.venv-lock/bin/python -m pip install -q --no-deps -r requirements/nodeps.txt
	.venv-lock/bin/python requirements/freeze.py $(LOCK) "The development environment (make setup)"
	python3 -m venv .venv-floor-lock
	.venv-floor-lock/bin/python -m pip install -q --upgrade pip
	.venv-floor-lock/bin/python -m pip install -q -c requirements/lock.in -c requirements/floor.txt \
		-r requirements/floor.txt setuptools -e ".[recipes,timm,pyg,hf,data,dev]"
	.venv-floor-lock/bin/python -m pip install -q --no-deps -r requirements/nodeps.txt
	.venv-floor-lock/bin/python requirements/freeze.py $(FLOOR_LOCK) "The floor environment (make test-floor)"
	.venv-lock/bin/python -m pytest $(XDIST) -q
	.venv-floor-lock/bin/python -m pytest $(XDIST) -q -m "not slow and not gpu"

# The main job: the text recipe compared across the seven foundation encodings, 3 seeds each,
# two runs at a time with one thread each (the committed results in results/ were made with one
# thread per run: other thread counts change the last bits of sums, and 800 steps carry that to
# the third decimal). Runs go to runs/results; a re-run skips what is stored there.
run: setup
	MMPE_THREADS=1 $(VENV)/bin/mmpe compare text --encodings sinusoidal,learned,rope,alibi,t5,fire,nope \
		--jobs 2 --store runs/results --out runs/compare/text

# Re-render every results table (and its plot) in README.md and docs/ from the committed store.
report: setup
	$(VENV)/bin/mmpe report --store results --write README.md docs/*.md

# Every comparison the README and docs report, into the committed store (hours on 2 cores; one
# thread per run). Stored runs are skipped, so it continues where an earlier call stopped;
# commit results/ as it grows, then `make report`.
CATALOGUE := nope,rope,alibi,axial,scaled_sinusoidal,rope_pi,rope_ntk,rope_dynamic_ntk,rope_yarn,rope_longrope,rope_llama3,xpos,shaw,transformer_xl,tener,huang_1,huang_2,huang_3,huang_4,deberta,cope,da_transformer,kerple_log,kerple_power,fox,stick_breaking
results: setup
	set -e; export MMPE_THREADS=1; M=$(VENV)/bin/mmpe; \
	$$M compare text --store results; \
	$$M compare text --store results --encodings sinusoidal,learned --setting concat -- --model.input_combine concat; \
	$$M compare multimodal --store results; \
	$$M compare multimodal --store results --encodings flamingo --setting gate0 -- --model.gate_init 0.0; \
	$$M compare vision --store results; \
	$$M compare molecules3d --store results; \
	$$M compare graph --store results; \
	$$M compare tabular --store results; \
	$$M compare sphere --store results; \
	$$M compare sst --store results; \
	$$M compare video --store results; \
	$$M compare vision --store results --encodings learned_grid,sincos --setting concat -- --model.input_combine concat; \
	$$M compare text --store results --setting short --encodings $(CATALOGUE) -- --trainer.max_steps 150 --data.eval_chars 8192; \
	test -d data/spoken_digits || $(PY) -m mmpe.recipes.audio_data --out data/spoken_digits; \
	$$M compare audio --store results

# The tests: `make test` the fast layer-by-layer suite (under 8 minutes on 2 cores),
# `make test-train` the recipe trainings, the tests that run fresh interpreters (docs blocks,
# the site build, a wheel, plugins) and the torch.compile tests; CI runs both. --durations
# names the slowest.
test: setup
	$(PYTEST) $(XDIST) -q --durations=15

test-train: setup
	$(PYTEST) $(XDIST) -q -m "(train or subprocess or compile or heavy) and not slow and not gpu" --durations=15

test-slow: setup
	$(PYTEST) -q -m slow

# make test's tier with every optional package hidden (as with `pip install mmpe` alone):
# the integration and recipe tests must skip, everything else must pass.
# The GPU tier: compiled FlexAttention against the math path for every score and kernel
# encoding, bounded compiles, each recipe on the GPU, the main job against the CPU runs.
# Skips (one line) where there is no CUDA device.
test-gpu: setup
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		MMPE_FLEX_STRICT=1 $(PYTEST) -q -m gpu -rs -rf; \
	else echo "make test-gpu: no CUDA device here; the GPU tier (tests/gpu/test_gpu.py) is skipped"; fi

# The tests at the declared minimum versions of torch, timm, PyG, transformers and Lightning
# (requirements/floor.txt), in their own environment: make test's tier (the trainings run at the
# locked versions in make test-train; CI's 45 minutes hold one pass of them).
FLOOR := .venv-floor
$(FLOOR)/.installed: pyproject.toml $(FLOOR_LOCK)
	$(call install_locked,$(FLOOR),$(FLOOR_LOCK))
	touch $@

test-floor: $(FLOOR)/.installed
	$(FLOOR)/bin/python -m pytest $(XDIST) -q --durations=15

test-core: setup
	MMPE_HIDE_EXTRAS=1 $(PYTEST) $(XDIST) -q --durations=15

# The documentation site (mkdocs material + mkdocstrings), offline, warnings as errors.
docs: setup
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --site-dir site

lint: setup
	$(VENV)/bin/ruff check mmpe recipes tests benchmarks

# Every benchmark; each also appends the tables it prints to $(BENCH_STORE)/<script>.jsonl, from
# which `make report` renders the benchmark tables of README.md and docs/ (no number typed).
BENCH_STORE ?= results/bench
bench: setup
	for f in benchmarks/bench_*.py benchmarks/gpu/bench_*.py; do \
		$(PY) $$f --store $(BENCH_STORE) || exit 1; done
	$(PY) benchmarks/bench_attention.py --coords --store $(BENCH_STORE)

# Debian data packages (needs root): espeak-ng for the audio recipe, proj-data for the geoid,
# bowtie2-examples for the genomics recipe's lambda phage genome.
apt:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS)

data-audio: setup
	$(PY) -m mmpe.recipes.audio_data --out data/spoken_digits

clean:
	rm -rf $(VENV) .venv-lock .venv-floor-lock runs site .pytest_cache

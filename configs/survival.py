"""Survival: at which learning rate does each arm stop surviving? (`make survival`)

One question, asked so that the answer does not depend on how long a run is: the seed figure's
recipe (configs/seed_figure.py) with
  - a schedule that does not move with the run: a fixed warm-up of WARMUP steps, then a
    constant learning rate, so "lr 0.3" means 0.3 at every step after the warm-up;
  - the fp16 loss scale starting at its equilibrium (2^15, where the seed figure's scaler
    settles), so backward overflow, MERT's loss-scale collapse, can happen from the start;
  - runs of NUM_STEPS steps, past the window where runs die (steps 55-107 in the sensitivity
    sweep; 36-72 in this experiment's pilot, one run at 139);
  - as a grid (`make survival-grid`): learning rates a quarter decade apart, placed by a pilot so
    that every arm's critical learning rate (50% of runs failing) lies inside it; SEEDS seeds;
  - as a search (`make survival`, the Makefile's SURVIVAL_SEARCH): each arm and seed's critical
    learning rate by bisection from [0.1, 1] (the grid shows every arm's seeds straddle it),
    5 rounds, 6 seeds. Within an arm failure is close to a deterministic function of the
    learning rate (every (arm, seed) of the grid is monotone), so a quarter-decade grid can
    only say which cell each arm's seeds fall in; bisection per seed resolves 1/16 decade.
Arms: Pre-LN with clip 1 and clip 10, Pre-LN with attention relax, DeepNorm, and the two controls
that separate DeepNorm's parts (Pre-LN + input norm, Post-LN + input norm).

The search writes critical_lr.csv/png (per arm the geometric mean critical learning rate over
seeds with its 95% t interval, pairwise paired t-tests with Holm's correction and equivalence
margins); the grid survival.csv/png (failure share against learning rate, the logistic fit and
the critical learning rate with its bootstrap interval, or the bracket where the learning rate
separates the outcomes completely; Fisher's test per learning rate, the stratified exact test
and the likelihood-ratio test of one curve per pair of arms); both the largest attention logit
at step LOGIT_STEP against learning rate. configs/survival_depth.py asks the same at 12 layers.
"""

from configs import seed_figure
from normstudy.core import config as config_lib

# The seed figure's arms; their "Run 1"/"Run 2" name the seed figure's single runs, and here a
# curve is many runs.
VARIANTS = {name: (label.replace(" | Run 1", "").replace(" | Run 2", ""), settings)
            for name, (label, settings) in seed_figure.VARIANTS.items()}
SWEEP_VARIANTS = ("pre_norm_clip1", "pre_norm_clip10", "pre_norm_attn_relax_clip1",
                  "pre_norm_input_norm_clip1", "post_norm_input_norm_clip1",
                  "post_norm_deepnorm_clip1")
STUDY_VARIANTS = SWEEP_VARIANTS

NUM_STEPS = 120
WARMUP = 20
LOGIT_STEP = 50  # telemetry every LOGIT_STEP steps: the attention logit is read at this step
SEEDS = [0, 1, 2]
# Quarter decades, 10^-1.25 (0.056) to 10^0.25 (1.78), placed by a pilot (one seed, 0.032 to 3.2
# by half decades: every arm survived 0.1 and died at 3.2; docs/results.md, "Survival").
LEARNING_RATES = [round(10 ** (e / 4), 6) for e in range(-5, 2)]

SWEEP = {"optimizer.learning_rate": LEARNING_RATES, "train.seed": SEEDS}
SWEEP_SETTINGS = {
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


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(VARIANTS, seed_figure.base_config, variant,
                                   "configs/survival.py")

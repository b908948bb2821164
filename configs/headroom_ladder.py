"""The headroom ladder: float16 headroom at the rates that learn, across width, depth and step,
under sp and muP (`make headroom-ladder`: `python -m normstudy.ladder
--config=configs/headroom_ladder.py --workdir=DIR`; issue 84, item 2).

The seed figure's four arms and DeepNorm's wiring control (Post-LN with the input norm), each
under sp and under muP (base width BASE_WIDTH, heads BASE_HEAD_DIM wide: at the 4 x 64 rung muP
is sp's model and rates), on the seed recipe (configs/seed_figure.py: warm-up 8% of the run,
then a polynomial decay to 0, clip as the arm says, the float16 loss scaler) at
LADDER_LEARNING_RATES, MERT's 1.5e-3 and the recipe's 3e-3, where every arm learns, SEEDS seeds,
telemetry every TELEMETRY_EVERY steps. Each run's headroom, log2(limit / value) per series
(normstudy.analysis.headroom), is what the ladder measures; normstudy.analysis.headroom_ladder
fits it as a plane in ln width, ln depth and ln step per arm, parametrization and rate.

Rungs: widths 64 to 512 at 4 layers and depths 4 to 16 at width 64 (heads 16 wide, the MLP 4x),
NUM_STEPS steps, the widest LARGE_STEPS (its steps cost ~64x the narrowest's). The held-out
rungs (HEADROOM_HELDOUT) train last: the law fitted to the others is written as
headroom_prediction.csv before they start, then judged by what they measured
(headroom_heldout.csv). The extrapolation is to --target_layers x --target_d_model x
--target_steps (MERT's 24 x 1024 x 100,000).

Cost: on this project's 2-core CPU a 4 x 64 run of 4000 steps takes about 5 minutes (one core,
~14 steps/s, 2026-12-07, Intel Xeon), so the 4 x 64 rung alone (10 arms x 2 rates x 2 seeds) is
about 3.2 core-hours and the file about 60; it is sized for one GPU, where each (arm, rung) is
one vmapped program of its 4 runs.
"""

from configs import seed_figure
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Ladder

NUM_STEPS = 4000
LARGE_STEPS = 2000
TELEMETRY_EVERY = 50
SEEDS = [0, 1]
HEAD_DIM = 16  # the miniature's 64 / 4
BASE_WIDTH = 64
BASE_HEAD_DIM = HEAD_DIM
LADDER_RUNGS = [(4, 64), (4, 128), (4, 256), (4, 512), (8, 64), (16, 64)]
HEADROOM_HELDOUT = [(4, 512), (16, 64)]
LADDER_DTYPES = ("float16",)
LADDER_LEARNING_RATES = [1.5e-3, 3e-3]

_SP = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
       "pre_norm_attn_relax_clip1", "post_norm_input_norm_clip1")
_ARMS = {name: seed_figure.EXPERIMENT.arms[name] for name in _SP}
_ARMS.update({
    f"{name}_mup": (f"{label} | muP", {**settings, "model.parametrization": "mup",
                                        "model.base_width": BASE_WIDTH,
                                        "model.base_head_dim": BASE_HEAD_DIM})
    for name, (label, settings) in list(_ARMS.items())})


def _length(num_steps: int) -> dict:
  """A run of `num_steps` steps with the recipe's schedule scaled to it (warm-up 8%)."""
  return {"train.num_steps": num_steps, "optimizer.warmup_steps": num_steps * 8 // 100}


def rung_steps(num_layers: int, d_model: int) -> int:
  """A rung's steps: LARGE_STEPS at the widest rung, NUM_STEPS elsewhere."""
  return LARGE_STEPS if d_model >= 512 else NUM_STEPS


def rung_overrides(num_layers: int, d_model: int) -> dict:
  """The fields one rung sets (normstudy.ladder passes them as --config.X=Y)."""
  overrides = {"model.num_layers": num_layers, "model.d_model": d_model,
               "model.d_ff": 4 * d_model, "model.num_heads": max(1, d_model // HEAD_DIM)}
  if rung_steps(num_layers, d_model) != NUM_STEPS:
    overrides.update(_length(rung_steps(num_layers, d_model)))
  return overrides


EXPERIMENT = Experiment(base=seed_figure.base_config, default_arm="pre_norm_clip1",
    arms=_ARMS, axes={"train.seed": SEEDS},
    settings={"label": "{auto}", **_length(NUM_STEPS), "train.log_every": 10,
              "train.eval_every": 1000, "train.telemetry_every": TELEMETRY_EVERY,
              "train.checkpoint_every": 1000, "train.tensorboard": False},
    ladder=Ladder(rungs=LADDER_RUNGS, dtypes=LADDER_DTYPES, rung_overrides=rung_overrides,
                  learning_rates=LADDER_LEARNING_RATES, heldout=HEADROOM_HELDOUT,
                  rung_steps=rung_steps))

get_config = EXPERIMENT.get_config

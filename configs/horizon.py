"""A long horizon where runs learn: the seed figure's four arms at the recipe's rate, to 20,000
steps (`make horizon`; issue 84, item 3).

The seed figure (configs/seed_figure.py) runs 1000 steps; MERT ran 100,000. This file keeps the
recipe and its rate (3e-3, where every arm learns) and stretches the run to NUM_STEPS = 20,000,
a fifth of MERT's horizon, with the schedule scaled with it (warm-up 8% of the run, as the
recipe's 80 of 1000, then polynomial decay to 0 at the end). One seed: the question is whether a
series drifts towards float16's limit over the horizon, read from its headroom over time
(normstudy.analysis.headroom: log2(65,504 / value) for the residual stream's, the MLP
pre-activations' and the attention logits' maxima, and log2 of the loss scale for the
gradients), not a comparison between arms. The figure is the seed figure's (loss and fp16 loss
scale against step, MERT's axes); headroom.csv and the forecast (normstudy.forecast) read the
same runs.

Telemetry every TELEMETRY_EVERY steps (400 points a run: the headroom series and the forecast's
input); a checkpoint every CHECKPOINT_EVERY, so a killed run loses at most that many steps and the
same command continues it.
"""

from configs import seed_figure
from normstudy.core import config as config_lib
from normstudy.core.experiment import Experiment

NUM_STEPS = 20_000
TELEMETRY_EVERY = 50
CHECKPOINT_EVERY = 1000
_RECIPE = seed_figure.base_config()
# The recipe's warm-up is 80 of its 1000 steps; the same fraction of this run's.
WARMUP_STEPS = _RECIPE.optimizer.warmup_steps * NUM_STEPS // _RECIPE.train.num_steps

# The recipe's length and records, changed for every arm (normstudy.study trains the arms as
# their configs say: the base config carries these, not an experiment's sweep settings).
_SETTINGS = {
    "train.num_steps": NUM_STEPS,
    "optimizer.warmup_steps": WARMUP_STEPS,
    "train.log_every": 10,
    "train.eval_every": 1000,
    "train.telemetry_every": TELEMETRY_EVERY,
    "train.checkpoint_every": CHECKPOINT_EVERY,
    "train.tensorboard": False,
}


def base_config():
  """The seed recipe, this file's length and records."""
  config = seed_figure.base_config()
  config_lib.apply_overrides(config, _SETTINGS)
  return config


EXPERIMENT = Experiment(
    base=base_config, default_arm="pre_norm_clip1",
    arms={name: seed_figure.EXPERIMENT.arms[name] for name in seed_figure.EXPERIMENT.study_arms},
    seeds=(0,), then=("normstudy.forecast --workdir={workdir} --out={workdir}",))

get_config = EXPERIMENT.get_config

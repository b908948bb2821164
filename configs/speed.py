"""Learning speed: how far and how fast does each arm learn at the recipe's learning rate?
(`make speed`)

The survival experiment (configs/survival.py) asks which learning rates kill an arm; this one
asks, at the seed figure's own learning rate (3e-3, where no arm dies), how low each arm's eval
loss gets and how soon it leaves the plateau (the unigram entropy, about 4.0 nats: a model that
uses no context). The same six arms as the survival experiment, SEEDS seeds each, NUM_STEPS steps
of the recipe's schedule (warm-up 80, polynomial decay to the end): long enough that the Pre-LN
arms leave the plateau (the 1000-step study shows them at about 3.5 nats near step 400).

The analysis writes speed.csv/png: the final eval loss per arm with its 95% interval over seeds,
the first step below the threshold halfway from the unigram entropy to the masked loss floor, and
each arm against the first (Pre-LN, clip 1) paired by seed (paired t-test and sign test, with
Holm's correction over the arms).
"""

from configs import seed_figure
from configs import survival
from normstudy.core.experiment import Experiment

NUM_STEPS = 600
# Six seeds: a sign test over seeds can reach p < 0.05 (two-sided, 0.031 at 6 of 6) only from 6.
SEEDS = [0, 1, 2, 3, 4, 5]
# Every run is evaluated on the same EVAL_ROWS validation rows with the same masks
# (train.eval_seed, the default 0), so arms and seeds are compared on the same data and the
# tests pair by seed.
EVAL_ROWS = 512
EXPERIMENT = Experiment(base=seed_figure.base_config, default_arm="pre_norm_clip1",
    arms=survival.EXPERIMENT.arms, sweep_arms=survival.EXPERIMENT.sweep_arms,
    study_arms=survival.EXPERIMENT.sweep_arms, axes={"train.seed": SEEDS},
    report="learning speed", settings={
    "train.num_steps": NUM_STEPS,
    "train.log_every": 10,
    "train.eval_every": 50,
    "train.eval_steps": EVAL_ROWS // seed_figure.base_config().train.batch_size,
    "train.telemetry_every": 0,
    "train.checkpoint_every": 200,
    "train.tensorboard": False,
})

get_config = EXPERIMENT.get_config

"""Does a language need attention? (`make attention`)

The same transformer with and without its attention sublayers (model.attention=none: the blocks
are MLPs, and the only context a token sees is the conv positions' 5-token window), SEEDS seeds
each, trained NUM_STEPS steps at the recipe's learning rate, on the context language
(configs/context.py) and, as the control, on the seed figure's Markov chain
(data.dialects=1, the experiment's part `chain`). The arm is Pre-LN with the input norm,
the recipe's fastest learner (docs/speed). The speed analysis compares the two arms paired by
seed (speed.csv, speed_tests.csv); each run's run.json holds the language's loss floor
(masked_loss_floor), which only a model that reads the whole row can approach: any model limited
to a 5-token window stays above the window bound `python -m normstudy.context_gap --floors`
prints.
"""

from configs import context
from configs import seed_figure
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Part

ARM = "pre_norm_input_norm_clip1"
_ARMS = {
    "attention": ("{auto} | Input Norm", dict(seed_figure.EXPERIMENT.arms[ARM][1])),
    "no_attention": ("{auto} | Input Norm | No Attention",
                     {**seed_figure.EXPERIMENT.arms[ARM][1], "model.attention": "none"}),
}

NUM_STEPS = 1000
SEEDS = [0, 1, 2]
EVAL_ROWS = 512
_SETTINGS = {
    "train.num_steps": NUM_STEPS,
    "train.log_every": 10,
    "train.eval_every": 100,
    "train.eval_steps": EVAL_ROWS // seed_figure.base_config().train.batch_size,
    "train.telemetry_every": 0,
    "train.checkpoint_every": NUM_STEPS,
    "train.tensorboard": False,
}
# Two sweeps: the context language (DIR/context) and its control, one dialect, a plain chain
# (DIR/chain); then `python -m normstudy.context_gap --workdir=DIR/<part>` for each.
EXPERIMENT = Experiment(
    base=context.base_config, arms=_ARMS, settings=_SETTINGS,
    parts={"context": Part(axes={"train.seed": SEEDS}),
           "chain": Part(axes={"train.seed": SEEDS}, settings={"data.dialects": 1})},
    then=("normstudy.context_gap --workdir={workdir}/context",
          "normstudy.context_gap --workdir={workdir}/chain"))

get_config = EXPERIMENT.get_config

"""DeepNet's claim in DeepNet's regime (`make depth`): does Post-LN stop converging as the model
gets deeper, with a model update that grows with depth, while DeepNorm trains?

Wang et al. 2022 ("DeepNet", sections 3-4) trace Post-LN's divergence to the size of the model
update early in training, ||F(x; theta_t+1) - F(x; theta_t)||, which grows with depth; DeepNorm's
alpha = (2N)^(1/4) on the residual and beta = (8N)^(-1/4) on the branch initialisation bound it.
Their setting, not the seed figure's: Xavier initialisation (model.init=xavier, which DeepNorm's
beta scales), no input norm, warm-up then the recipe's decay at an ordinary learning rate,
float32 here so that fp16's headroom plays no part (that question is `make survival-bf16`'s).

Arms: Post-LN, DeepNorm and Pre-LN (the reference), each over DEPTHS at the miniature's width
(64) and SEEDS seeds, on the context language (configs/context.py), NUM_STEPS steps at
LEARNING_RATE (placed by a pilot: docs/results.md, "Depth"). Every run records DeepNet's
measures for its first UPDATE_SIZE_STEPS steps: `update_size`, ||F(x; theta_t+1) -
F(x; theta_t)||, and `accumulated_update`, ||F(x; theta_t) - F(x; theta_0)||; and every
TELEMETRY_EVERY steps the RMS of what each layer's norms are given (`attn_norm_input_rms`,
`mlp_norm_input_rms`: Post-LN's alpha x + F(x)). The analysis (normstudy.analysis.depth) writes
depth.csv, depth_tests.csv, depth_updates.csv, depth_norm_inputs.csv and depth.png: the share
of runs that converge against depth per arm, with exact tests, and the update sizes and norm
inputs as series.
"""

from configs import context
from normstudy.core.experiment import Experiment

_ARMS = {
    "post_norm": ("{auto}", {"model.placement": "post_ln"}),
    "post_norm_deepnorm": ("{auto}", {"model.placement": "deepnorm"}),
    "pre_norm": ("{auto}", {"model.placement": "pre_ln"}),
}

DEPTHS = [6, 12, 24]
SEEDS = [0, 1, 2]
NUM_STEPS = 200
# Placed by two pilots (docs/results.md, "Depth"): at the recipe's 3e-3 with 20 warm-up steps
# Post-LN stayed on the unigram plateau at every depth from 6 (docs/depth_lr0.003/), so depth
# could not be what fails it; at 1e-3 with 100 warm-up steps a 6-layer Post-LN leaves the
# plateau by step 200 and a 24-layer one does not (one seed): the regime DeepNet describes.
WARMUP = 100
LEARNING_RATE = 1e-3
UPDATE_SIZE_STEPS = 100
TELEMETRY_EVERY = 5
EVAL_ROWS = 256

_AXES = {"model.num_layers": DEPTHS, "train.seed": SEEDS}
_SETTINGS = {
    "train.num_steps": NUM_STEPS,
    "optimizer.warmup_steps": WARMUP,
    "train.update_size_steps": UPDATE_SIZE_STEPS,
    "train.log_every": 10,
    "train.eval_every": NUM_STEPS // 2,
    "train.eval_steps": EVAL_ROWS // context.base_config().train.batch_size,
    "train.telemetry_every": TELEMETRY_EVERY,
    "train.checkpoint_every": NUM_STEPS,
    "train.tensorboard": False,
}




def base_config():
  """The context language with DeepNet's setting: Xavier init, no input norm, float32."""
  config = context.base_config()
  config.model.init = "xavier"
  config.model.input_norm = False
  config.model.dtype = "float32"
  config.optimizer.learning_rate = LEARNING_RATE
  return config


EXPERIMENT = Experiment(base=base_config, arms=_ARMS, axes=_AXES, settings=_SETTINGS,
                        report="depth")

get_config = EXPERIMENT.get_config

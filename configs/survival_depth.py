"""Survival at depth: DeepNorm against its Post-LN control at 12 layers (`make survival-depth`).

DeepNorm's claim (Wang et al. 2022, "DeepNet") is about depth: alpha = (2N)^(1/4) and
beta = (8N)^(-1/4) keep Post-LN's updates bounded as N grows, so at 4 layers (alpha 1.68, beta
0.42) the correction is small. This asks configs/survival.py's question for DeepNorm and Post-LN
with the same input norm (alpha = beta = 1) at 12 layers, where alpha is 2.21 and beta 0.32.
"""

from configs import seed_figure
from configs import survival
from normstudy.core import config as config_lib

VARIANTS = survival.VARIANTS
SWEEP_VARIANTS = ("post_norm_input_norm_clip1", "post_norm_deepnorm_clip1")
STUDY_VARIANTS = SWEEP_VARIANTS
NUM_LAYERS = 12

SWEEP = {"optimizer.learning_rate": survival.LEARNING_RATES, "train.seed": survival.SEEDS,
         "model.num_layers": [NUM_LAYERS]}
SWEEP_SETTINGS = dict(survival.SWEEP_SETTINGS)


def get_config(variant: str = "post_norm_deepnorm_clip1"):
  return config_lib.variant_config(VARIANTS, seed_figure.base_config, variant,
                                   "configs/survival_depth.py")

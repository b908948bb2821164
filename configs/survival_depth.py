"""Survival at depth: DeepNorm against its Post-LN control at 12 layers (`make survival-depth`).

DeepNorm's claim (Wang et al. 2022, "DeepNet") is about depth: alpha = (2N)^(1/4) and
beta = (8N)^(-1/4) keep Post-LN's updates bounded as N grows, so at 4 layers (alpha 1.68, beta
0.42) the correction is small. This asks configs/survival.py's question for DeepNorm and Post-LN
with the same input norm (alpha = beta = 1) at 12 layers, where alpha is 2.21 and beta 0.32.
"""

import dataclasses

from configs import survival

NUM_LAYERS = 12
_ARMS = ("post_norm_input_norm_clip1", "post_norm_deepnorm_clip1")
EXPERIMENT = dataclasses.replace(
    survival.EXPERIMENT, default_arm="post_norm_deepnorm_clip1", sweep_arms=_ARMS, study_arms=_ARMS,
    parts={},
    axes={"train.seed": survival.SEARCH_SEEDS, "model.num_layers": [NUM_LAYERS]})

get_config = EXPERIMENT.get_config

"""configs/ladder_mup.py's muP part: the ladder's width rungs (configs/ladder.py) for plain Pre-LN
and DeepNorm under muP, base width 32 (at the 4 x 32 rung muP is sp's model and rate)."""

import dataclasses

from configs import ladder
# The CPU ladder's dtypes, rung fields and recipe (its axes and settings: EXPERIMENT's); only
# arms and rungs differ.
from configs.ladder import LADDER_DTYPES, base_config, rung_overrides  # noqa: F401
from normstudy.core import config as config_lib

BASE_WIDTH = 32
_ARMS = {
    f"{name}_mup": (label, {**settings, "model.parametrization": "mup",
                            "model.base_width": BASE_WIDTH})
    for name, (label, settings) in ladder.EXPERIMENT.arms.items()
    if name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS)

LADDER_RUNGS = [rung for rung in ladder.LADDER_RUNGS if rung[0] == 4]  # the width rungs
LADDER_SEARCH = ladder.LADDER_SEARCH


def get_config(variant: str = "pre_norm_clip1_mup"):
  return config_lib.variant_config(EXPERIMENT.arms, base_config, variant,
                                   "configs/ladder_mup_width.py")

"""configs/ladder_mup.py's sp part: the standard parametrization's arms trained beside the
parametrized ones at every rung they use (configs/ladder_mup_width.py: 4 x 16..512 and 2..32 x
32), so each slope is compared with sp's over all of its rungs, in the same sitting: the
committed sp ladder (docs/ladder) stops at 4 x 128 and 16 layers. Plain Pre-LN and DeepNorm with
clip 1 (the transfer's reference arms) and plain Pre-LN with the clip off (the reference of the
parametrized no-clip arms: a control that changes one thing)."""

import dataclasses

from configs import ladder
from configs import ladder_mup_width
# The CPU ladder's dtypes, rung fields and recipe; only arms and rungs differ.
from configs.ladder import LADDER_DTYPES, LADDER_SEARCH, base_config, rung_overrides  # noqa: F401
from normstudy.core import config as config_lib

_ARMS = {name: ladder.EXPERIMENT.arms[name]
         for name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
_ARMS["pre_norm_noclip"] = ("{auto}", {**ladder.EXPERIMENT.arms["pre_norm_clip1"][1],
                                      "optimizer.clip_norm": 0.0})
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS)

LADDER_RUNGS = ladder_mup_width.WIDTH_RUNGS + [
    rung for rung in ladder_mup_width.DEPTH_RUNGS if rung not in ladder_mup_width.WIDTH_RUNGS]


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(EXPERIMENT.arms, base_config, variant,
                                   "configs/ladder_sp_control.py")

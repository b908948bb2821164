"""configs/ladder_mup.py's sp part: the standard parametrization's arms trained beside the
parametrized ones at every rung they use (configs/ladder_mup_width.py: 4 x 16..512 and 2..32 x
32), so each slope is compared with sp's over all of its rungs, in the same sitting: the
committed sp ladder (docs/ladder) stops at 4 x 128 and 16 layers. Plain Pre-LN and DeepNorm with
clip 1 (the transfer's reference arms) and plain Pre-LN with the clip off (the reference of the
parametrized no-clip arms: a control that changes one thing)."""

import dataclasses

from configs import ladder
from configs import ladder_mup_width

_ARMS = {name: ladder.EXPERIMENT.arms[name]
         for name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
_ARMS["pre_norm_noclip"] = ("{auto}", {**ladder.EXPERIMENT.arms["pre_norm_clip1"][1],
                                      "optimizer.clip_norm": 0.0})
# The CPU ladder's recipe, dtypes, rung fields and search; only the arms and rungs differ.
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS, ladder=dataclasses.replace(
    ladder.EXPERIMENT.ladder, rungs=ladder_mup_width.WIDTH_RUNGS + [
        rung for rung in ladder_mup_width.DEPTH_RUNGS if rung not in ladder_mup_width.WIDTH_RUNGS]))

get_config = EXPERIMENT.get_config

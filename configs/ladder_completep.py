"""configs/ladder_mup.py's CompleteP part: the depth rungs (configs/ladder_mup_width.py: 2 to 32
layers at width 32) for plain Pre-LN under CompleteP, base 4 layers x 32 (at the 4 x 32 rung
CompleteP is sp's model and rate)."""

import dataclasses

from configs import ladder
from configs import ladder_mup_width

_ARMS = {
    "pre_norm_clip1_completep": (ladder.EXPERIMENT.arms["pre_norm_clip1"][0], {
        **ladder.EXPERIMENT.arms["pre_norm_clip1"][1], "model.parametrization": "completep",
        "model.base_width": 32, "model.base_depth": 4}),
}
_ARMS["pre_norm_noclip_completep"] = ("{auto}", {**_ARMS["pre_norm_clip1_completep"][1],
                                                "optimizer.clip_norm": 0.0})
# The CPU ladder's recipe, dtypes, rung fields and search; only the arms and rungs differ.
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS, ladder=dataclasses.replace(
    ladder.EXPERIMENT.ladder, rungs=ladder_mup_width.DEPTH_RUNGS))  # 2..32 x 32

get_config = EXPERIMENT.get_config

"""configs/ladder_mup.py's muP part: the ladder's width rungs (configs/ladder.py) continued to
4 x 256 and 4 x 512 (WIDTH_RUNGS) for plain Pre-LN and DeepNorm under muP, base width 32 (at the
4 x 32 rung muP is sp's model and rate), and plain Pre-LN under muP with the clip off (issue 85:
whether the rate transfers without the clip, which acts on most of sp's steps)."""

import dataclasses

from configs import ladder

BASE_WIDTH = 32
_ARMS = {
    f"{name}_mup": (label, {**settings, "model.parametrization": "mup",
                            "model.base_width": BASE_WIDTH})
    for name, (label, settings) in ladder.EXPERIMENT.arms.items()
    if name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
_ARMS["pre_norm_noclip_mup"] = ("{auto}", {**_ARMS["pre_norm_clip1_mup"][1],
                                          "optimizer.clip_norm": 0.0})
# The CPU ladder's width rungs (4 x 16..128) and two more: where sp's block outputs after 10
# steps have grown 72-191x (docs/coordcheck), so a rate that transfers has to hold there.
WIDTH_RUNGS = [rung for rung in ladder.LADDER_RUNGS if rung[0] == 4] + [(4, 256), (4, 512)]
# The CPU ladder's depth rungs (2..16 x 32) and 32 layers (CompleteP's part, the sp control).
DEPTH_RUNGS = [rung for rung in ladder.LADDER_RUNGS if rung[1] == 32] + [(32, 32)]
# The CPU ladder's recipe, dtypes, rung fields and search; only the arms and rungs differ.
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS, ladder=dataclasses.replace(
    ladder.EXPERIMENT.ladder, rungs=WIDTH_RUNGS))

get_config = EXPERIMENT.get_config

"""configs/ladder_mup.py's u-muP part: the width rungs (configs/ladder_mup_width.py, 4 x 16..512)
for plain Pre-LN under u-muP (untied head; its rules need no base shape), in float16 without a loss scaler
and with fairseq's (in float32 the two arms are one model).

u-muP's learning rate is the base of per-parameter rates (a hidden matrix's is lr / sqrt(fan_in)
on unit-scale weights used times 1 / sqrt(fan_in)), so its critical value lies about a decade and
a half above sp's: the search starts from [0.3, 30] (it widens the bracket where that is wrong)."""

import dataclasses

from configs import ladder
from configs import ladder_mup_width

_UMUP = {"model.parametrization": "umup", "model.tie_embeddings": False}
_ARMS = {
    "pre_norm_clip1_umup": ("{auto} | No Loss Scaler", {
        **ladder.EXPERIMENT.arms["pre_norm_clip1"][1], **_UMUP, "optimizer.loss_scale.kind": "none"}),
    "pre_norm_clip1_umup_scaler": ("{auto} | Loss Scaler", {
        **ladder.EXPERIMENT.arms["pre_norm_clip1"][1], **_UMUP}),
    # The clip off: clip 1 acted on none of u-muP's steps in the coordinate check (true
    # gradient norms 0.02-0.81), so this arm tests that its clip is idle at every rung.
    "pre_norm_noclip_umup": ("{auto} | No Loss Scaler", {
        **ladder.EXPERIMENT.arms["pre_norm_clip1"][1], **_UMUP, "optimizer.loss_scale.kind": "none",
        "optimizer.clip_norm": 0.0}),
}
# The CPU ladder's recipe, dtypes and rung fields at the width rungs (4 x 16..512); its search
# a decade higher (u-muP's rates are the unit-scaled ones).
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, arms=_ARMS, ladder=dataclasses.replace(
    ladder.EXPERIMENT.ladder, rungs=ladder_mup_width.WIDTH_RUNGS,
    search=dataclasses.replace(ladder.LADDER_SEARCH, low=0.3, high=30.0)))

get_config = EXPERIMENT.get_config

"""The size ladder under parametrizations built for transfer (`make ladder-mup`: `python -m
normstudy.ladder --config=configs/ladder_mup.py --workdir=DIR`).

The ladder's instrument (configs/ladder.py: 120-step runs of the survival recipe on Shakespeare,
2 seeds, a search of 3 rounds and a probe round, float16 and float32) at width rungs 4 layers x
16..512 under muP and u-muP, and at depth rungs 2..32 layers x 32 under CompleteP; each with a
no-clip arm (issue 85: whether the transfer is the clip's). Each part is a ladder file of its
own (its Ladder's parts, trained into DIR/<part>/...):
  mup        plain Pre-LN and DeepNorm under muP, base width 32 (the ladder's shared rung, where
             muP is sp's model and rate);
  umup       plain Pre-LN under u-muP (untied head), float16 without a loss scaler
             (loss_scale.kind=none) and, beside it, with fairseq's scaler: in float32 the two are
             one model, so their two searches there check the instrument's repeatability;
  completep  plain Pre-LN under CompleteP, base 4 layers x 32 (DeepNorm has its own depth
             scaling: the combination is refused);
  sp         the standard parametrization's reference arms at every one of those rungs (the
             committed sp ladder stops at 4 x 128 and 16 layers), and Pre-LN without the clip.
ladder_parametrization.csv sets each arm's slope beside sp's (its Transfer's arms: arm -> its
sp arm): the sp part's rungs, and where it has none the committed docs/ladder/ladder.csv
(its Transfer's reference, the same instrument and arms). ladder_clip.csv says how often each arm's
clip acted at each rung.

Weight decay under every parametrization keeps lr x weight_decay per parameter (independent
decay, Wang & Aitchison 2025; normstudy.core.parametrizations): at 120 steps and 0.01 it is small.
"""

import dataclasses

from configs import ladder_mup_width
from normstudy.core.experiment import Ladder
from normstudy.core.experiment import Transfer

_TRANSFER_ARMS = {
    "pre_norm_clip1_mup": "pre_norm_clip1",
    "post_norm_deepnorm_clip1_mup": "post_norm_deepnorm_clip1",
    "pre_norm_clip1_umup": "pre_norm_clip1",
    "pre_norm_clip1_umup_scaler": "pre_norm_clip1",
    "pre_norm_clip1_completep": "pre_norm_clip1",
    "pre_norm_noclip_mup": "pre_norm_noclip",
    "pre_norm_noclip_umup": "pre_norm_noclip",
    "pre_norm_noclip_completep": "pre_norm_noclip",
}
# A ladder of ladders: each part's own file trains into DIR/<part>/. Its arms, for a command
# that reads one config from this file (`--config=configs/ladder_mup.py:ARM`), are the muP
# part's.
EXPERIMENT = dataclasses.replace(ladder_mup_width.EXPERIMENT, ladder=Ladder(
    parts={"mup": "configs/ladder_mup_width.py", "umup": "configs/ladder_umup.py",
           "completep": "configs/ladder_completep.py", "sp": "configs/ladder_sp_control.py"},
    transfer=Transfer(reference="docs/ladder/ladder.csv", arms=_TRANSFER_ARMS)))

get_config = EXPERIMENT.get_config

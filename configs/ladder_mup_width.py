"""configs/ladder_mup.py's muP part: the ladder's width rungs (configs/ladder.py) for plain Pre-LN
and DeepNorm under muP, base width 32 (at the 4 x 32 rung muP is sp's model and rate)."""

from configs import ladder
# The CPU ladder's dtypes, sweep, settings, rung fields and recipe; only arms and rungs differ.
from configs.ladder import LADDER_DTYPES, SWEEP, SWEEP_SETTINGS, base_config, rung_overrides  # noqa: F401,E501
from normstudy.core import config as config_lib

BASE_WIDTH = 32
VARIANTS = {
    f"{name}_mup": (label, {**settings, "model.parametrization": "mup",
                            "model.base_width": BASE_WIDTH})
    for name, (label, settings) in ladder.VARIANTS.items()
    if name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
SWEEP_VARIANTS = tuple(VARIANTS)
STUDY_VARIANTS = SWEEP_VARIANTS

LADDER_RUNGS = [rung for rung in ladder.LADDER_RUNGS if rung[0] == 4]  # the width rungs
LADDER_SEARCH = ladder.LADDER_SEARCH


def get_config(variant: str = "pre_norm_clip1_mup"):
  return config_lib.variant_config(VARIANTS, base_config, variant, "configs/ladder_mup_width.py")

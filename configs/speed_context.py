"""Learning speed on the context language (`make speed-context`): configs/speed.py's arms, seeds
and schedule where attention matters (configs/context.py)."""

from configs import context
from configs import speed
from normstudy.core import config as config_lib

VARIANTS = speed.VARIANTS
SWEEP_VARIANTS = speed.SWEEP_VARIANTS
STUDY_VARIANTS = SWEEP_VARIANTS
SWEEP = speed.SWEEP
SWEEP_SETTINGS = speed.SWEEP_SETTINGS


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(VARIANTS, context.base_config, variant,
                                   "configs/speed_context.py")

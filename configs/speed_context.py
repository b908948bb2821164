"""Learning speed on the context language (`make speed-context`): configs/speed.py's arms, seeds
and schedule where attention matters (configs/context.py)."""

from configs import context
from configs import speed
from normstudy.core import config as config_lib

EXPERIMENT = speed.EXPERIMENT


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(EXPERIMENT.arms, context.base_config, variant,
                                   "configs/speed_context.py")

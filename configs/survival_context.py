"""Survival on the context language (`make survival-context`): configs/survival.py's question,
its arms, schedule and search, asked where attention matters (configs/context.py)."""

from configs import context
from configs import survival
from normstudy.core import config as config_lib

VARIANTS = survival.VARIANTS
SWEEP_VARIANTS = survival.SWEEP_VARIANTS
STUDY_VARIANTS = SWEEP_VARIANTS
SWEEP = survival.SWEEP
SWEEP_SETTINGS = survival.SWEEP_SETTINGS


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(VARIANTS, context.base_config, variant,
                                   "configs/survival_context.py")

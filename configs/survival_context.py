"""Survival on the context language (`make survival-context`): configs/survival.py's question,
its arms, schedule and search, asked where attention matters (configs/context.py)."""

import dataclasses

from configs import context
from configs import survival
from normstudy.core import config as config_lib

EXPERIMENT = dataclasses.replace(survival.EXPERIMENT, parts={})  # the search alone


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(EXPERIMENT.arms, context.base_config, variant,
                                   "configs/survival_context.py")

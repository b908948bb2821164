"""Survival as a grid (`make survival-grid`): configs/survival.py's arms and instrument at
learning rates a quarter decade apart (placed by a pilot so that every arm's critical learning
rate lies inside the grid) x 3 seeds, for comparison with its search."""

import dataclasses

from configs import seed_figure
from configs import survival
from normstudy.core import config as config_lib

EXPERIMENT = dataclasses.replace(
    survival.EXPERIMENT, search=None, parts={}, report="learning-rate sweep",
    axes={"optimizer.learning_rate": survival.LEARNING_RATES, "train.seed": survival.SEEDS})


def get_config(variant: str = "pre_norm_clip1"):
  return config_lib.variant_config(EXPERIMENT.arms, seed_figure.base_config, variant,
                                   "configs/survival_grid.py")

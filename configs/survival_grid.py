"""Survival as a grid (`make survival-grid`): configs/survival.py's arms and instrument at
learning rates a quarter decade apart (placed by a pilot so that every arm's critical learning
rate lies inside the grid) x 3 seeds, for comparison with its search."""

import dataclasses

from configs import survival

EXPERIMENT = dataclasses.replace(
    survival.EXPERIMENT, search=None, parts={}, report="learning-rate sweep",
    axes={"optimizer.learning_rate": survival.LEARNING_RATES, "train.seed": survival.SEEDS})

get_config = EXPERIMENT.get_config

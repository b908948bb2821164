"""Survival on the context language (`make survival-context`): configs/survival.py's question,
its arms, schedule and search, asked where attention matters (configs/context.py)."""

import dataclasses

from configs import context
from configs import survival

# The search alone, on the context language.
EXPERIMENT = dataclasses.replace(survival.EXPERIMENT, base=context.base_config, parts={})

get_config = EXPERIMENT.get_config

"""Learning speed on the context language (`make speed-context`): configs/speed.py's arms, seeds
and schedule where attention matters (configs/context.py)."""

import dataclasses

from configs import context
from configs import speed

EXPERIMENT = dataclasses.replace(speed.EXPERIMENT, base=context.base_config)

get_config = EXPERIMENT.get_config

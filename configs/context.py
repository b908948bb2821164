"""The context language: the seed figure's recipe and arms on a language that needs attention.
`--config=configs/context.py:<variant>`, the same arm names as configs/seed_figure.py.

The seed figure's Markov chain needs no attention: for masked prediction the nearest visible
neighbours are sufficient (a model whose attention is broken loses little, docs/results.md).
Here each document speaks one of DIALECTS hidden dialects (normstudy.data.synthetic): the shared
chain mixed with DIALECT_WEIGHT of a chain of the dialect's own. One transition says little
about the dialect, a 64-token row nearly all, so the loss floor (run.json's masked_loss_floor
and entropy_floor, exact per row from the generator) is reached only by a model that mixes
information across the row. The control `--config.model.attention=none` removes every
attention sublayer (its only context is the conv positions' 5-token window); the Bayes loss of
any model limited to that window is above the floor by LOCAL_WINDOW_GAP (docs/results.md).
"""

import dataclasses

from configs import seed_figure

# The seed figure's experiment on this data (one seed per arm in a study).

DIALECTS = 16
DIALECT_WEIGHT = 0.3
# Validation rows from 64 documents (2^18 tokens), so that every dialect is in the eval set.
VALIDATION_TOKENS = 2**18


def base_config():
  """The seed figure's recipe (configs/seed_figure.py) on the context language."""
  config = seed_figure.base_config()
  config.data.dialects = DIALECTS
  config.data.dialect_weight = DIALECT_WEIGHT
  config.data.validation_tokens = VALIDATION_TOKENS
  return config


EXPERIMENT = dataclasses.replace(seed_figure.EXPERIMENT, base=base_config, seeds=())

get_config = EXPERIMENT.get_config

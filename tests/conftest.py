"""Shared fixtures. Tests run on the CPU; tiny sizes keep the whole suite within minutes.

Almost all of the suite's time is XLA compilation, so every test process and every subprocess it
starts shares one persistent compilation cache (a temporary directory per session): a program
compiled once is loaded, not compiled again. Tests also compile with LLVM's backend optimisation
level 0 (XLA's HLO passes still run; what a program computes does not change, only how fast its
machine code is): on the tiny test models compilation takes ~40% less time and running them
takes no longer.
"""

import copy
import os
import tempfile

_CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                               tempfile.mkdtemp(prefix="normstudy_jax_cache_"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import pytest  # noqa: E402

from normstudy import config as config_lib  # noqa: E402


def tiny_config(**model_overrides):
  config = config_lib.default_config()
  config.model.update(num_layers=2, d_model=32, num_heads=4, d_ff=64, vocab_size=32, max_len=16)
  config.model.update(model_overrides)
  config.optimizer.update(learning_rate=3e-3, warmup_steps=0, schedule="constant")
  config.train.update(num_steps=20, batch_size=4)
  return config


def train_losses(config, steps: int):
  """(losses, last metrics) of `steps` jitted train steps from the initial state, on one fixed
  batch of random tokens: the quickest check that a stack learns."""
  import jax  # after the XLA flags above are set
  from normstudy import steps as steps_lib
  state = steps_lib.create_train_state(config)
  step = jax.jit(steps_lib.make_train_step(config))
  batch = {"tokens": jax.random.randint(jax.random.PRNGKey(1), (4, 16), 0,
                                        config.model.vocab_size)}
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return losses, metrics


@pytest.fixture
def make_config():
  return lambda **kw: copy.deepcopy(tiny_config(**kw))

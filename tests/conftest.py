"""Shared fixtures. Tests run on the CPU; tiny sizes keep the whole suite within minutes.

Almost all of the suite's time is XLA compilation, so every test process and every subprocess it
starts shares one persistent compilation cache (a temporary directory per session): a program
compiled once is loaded, not compiled again. Tests also compile with LLVM's backend optimisation
level 0 (XLA's HLO passes still run; what a program computes does not change, only how fast its
machine code is) and with XLA:CPU's older elemental emitters instead of its fusion emitters
(jaxlib 0.10.2: a test train step compiles in 1.5 s instead of 3.2 s and runs as fast, while at
the benchmark's size S a step takes 1.5x as long, so normstudy itself keeps XLA's defaults; float16
results may differ from the default emitters' in the last bits, so every process of a test run,
subprocesses included, inherits the same flags).
"""

import copy
import os
import tempfile

_CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                               tempfile.mkdtemp(prefix="normstudy_jax_cache_"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# Figures as PNG alone: an SVG copy renders each figure again (about half of a small sweep's
# analysis); the tests of the copies ask for them (normstudy.records.schema.figure_formats).
os.environ.setdefault("NORMSTUDY_FIGURE_FORMATS", "")
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

# The options a user's process compiles with (XLA's defaults, xla/debug_options_flags.cc), for
# the few tests whose claim is exact equality of two different programs: that holds for the
# programs XLA builds by default, not for every emitter (the fast test flags above fuse
# differently).
USER_COMPILER_OPTIONS = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}

import pytest  # noqa: E402

from normstudy.core import config as config_lib  # noqa: E402


def tiny_config(**model_overrides):
  """A model small enough to compile in about a second. One layer: most claims (a step's
  arithmetic, an option's effect, a placement's parameters) hold per layer, and a second one costs
  15-25% of a compilation; tests about stacking (scan vs loop, causality through layers, per-layer
  telemetry, Mix-LN's switch, parameter counts per layer) ask for their depth."""
  config = config_lib.default_config()
  config.model.update(num_layers=1, d_model=32, num_heads=4, d_ff=64, vocab_size=32, max_len=16)
  config.model.update(model_overrides)
  config.optimizer.update(learning_rate=3e-3, warmup_steps=0, schedule="constant")
  config.train.update(num_steps=20, batch_size=4)
  return config


def parameter_layout(config) -> tuple:
  """Every parameter's path, shape and logical axes (what a mesh shards), sorted."""
  import jax  # after the XLA flags above are set
  import numpy as np
  from flax import linen as nn
  from normstudy.core import per_run
  from normstudy.core import steps
  values = jax.tree.map(np.asarray, per_run.run_values(config))
  boxed = jax.eval_shape(lambda: steps.init_state(config, values)).params
  specs = jax.tree.leaves(nn.get_partition_spec(boxed),
                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
  return tuple(sorted((jax.tree_util.keystr(path), leaf.shape, str(spec))
                      for (path, leaf), spec in zip(leaves, specs)))


def train_losses(config, steps: int):
  """(losses, last metrics) of `steps` jitted train steps from the initial state, on one fixed
  batch of random tokens: the quickest check that a stack learns."""
  import jax  # after the XLA flags above are set
  import inprocess
  from normstudy.core import steps as steps_lib
  state = inprocess.create_train_state(config)
  step = jax.jit(steps_lib.make_train_step(config))
  batch = {"tokens": jax.random.randint(jax.random.key(1), (4, 16), 0,
                                        config.model.vocab_size)}
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return losses, metrics


@pytest.fixture
def make_config():
  return lambda **kw: copy.deepcopy(tiny_config(**kw))


def pytest_collection_modifyitems(items):
  """End-to-end (slow) tests first, so that with several workers (`make test`: pytest-xdist's
  worksteal) the long ones start at once and the short ones fill in around them."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _signal_handlers_as_they_were(request):
  """Each test leaves SIGINT and SIGTERM as it found them: a handler left behind (a command
  run in this process ignores Ctrl-C once done) would pass to every process a later test
  starts, and a Ctrl-C test's command would train on. A test that changed one fails here."""
  import signal
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  yield
  after = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  for s, handler in before.items():
    signal.signal(s, handler)
  changed = [signal.Signals(s).name for s in before if after[s] != before[s]]
  assert not changed, f"{request.node.nodeid} left {', '.join(changed)} changed: {after}"

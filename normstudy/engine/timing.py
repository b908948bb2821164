"""Timing a train step as the engine runs it: what every benchmark of benchmarks/ shares, here
so that the scripts share code only through the package.

  step_seconds(config, steps)        seconds per compiled step of one run (or K runs: `runs`)
  grid_runs(config, k)               K runs of `config` as a sweep's grid holds them
  EngineSteps(config)                one run stepped by blocks or one step per dispatch
  model_flops_per_step(config)       the matmul FLOPs of a step (forward and backward)
  matmul_flops_per_second()          this machine's dense float32 matmul rate, measured now
  token_batch, encoder_batch         one random batch of a decoder's tokens, of an encoder's
                                     tokens and mask

MFU = model FLOPs per step / step time / a matmul rate: the count takes every matmul of the
forward pass (q, k, v, out, fc1, fc2, the scores and the attention-weighted sum over the full
length, the output head) and twice that for the backward pass.
"""

import copy
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from normstudy.engine import execution
from normstudy.engine import sharding


def model_flops_per_step(config) -> float:
  """The matmul FLOPs of one train step of `config` (module docstring)."""
  m, b = config.model, config.train.batch_size
  per_token_layer = 2 * (4 * m.d_model * m.d_model + 2 * m.d_model * m.d_ff
                         + 2 * m.max_len * m.d_model)
  per_token = m.num_layers * per_token_layer + 2 * m.d_model * m.vocab_size
  return 3.0 * per_token * m.max_len * b


def matmul_flops_per_second(n: int = 2048, repeats: int = 10, dtype=jnp.float32) -> float:
  """The median rate of a jitted n x n matmul in `dtype` on the default device, after a
  warm-up: the denominator of an MFU relative to what the machine does now."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * n**3 / statistics.median(times)


def time_steps(train_step, state, batch, steps: int) -> list[float]:
  """Seconds of each of `steps` calls of `train_step` after one that compiles it."""
  state, metrics = train_step(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return times


def token_batch(config) -> dict:
  """A decoder's random batch, [batch, length] tokens (seed 0)."""
  m = config.model
  rng = np.random.default_rng(0)
  return {"tokens": jnp.asarray(
      rng.integers(0, m.vocab_size, (config.train.batch_size, m.max_len)), jnp.int32)}


def encoder_batch(config) -> dict:
  """An encoder's random batch of one run, [1, batch, length] tokens and mask (seed 0)."""
  m, rng = config.model, np.random.default_rng(0)
  return {"tokens": np.asarray(rng.integers(0, m.vocab_size, (1, config.train.batch_size,
                                                              m.max_len)), np.int32),
          "mask": rng.random((1, config.train.batch_size, m.max_len)) < config.data.mask_prob}


def run_batch(config) -> dict:
  """One run's batch with its run axis: the encoder's, or the decoder's tokens."""
  if not config.model.causal:
    return encoder_batch(config)
  return {"tokens": np.asarray(token_batch(config)["tokens"])[None]}


def grid_runs(config, k: int) -> list:
  """K runs of `config` as a sweep's grid holds them, differing only in per-run fields: learning
  rates 1e-3 and 3e-3 times seeds 0..K/2-1 (K even)."""
  runs = []
  for lr in (1e-3, 3e-3):
    for seed in range(k // 2):
      run = copy.deepcopy(config)
      run.optimizer.learning_rate, run.train.seed = lr, seed
      runs.append(run)
  return runs


def step_seconds(config, steps: int, runs=None) -> list[float]:
  """Seconds per train step of normstudy's engine, after compilation: by default one run (what
  normstudy.main runs: the vmapped step over a run axis of size 1, sharded on a one-device
  mesh); with `runs`, a list of K configs, the K runs as one program, as a sweep steps them
  (normstudy.engine.execution chooses how for the device). One random batch, the same for
  every run, placed on the device once."""
  runs = runs or [config]
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  program = execution.ProgramSteps(config, mesh, num_runs=len(runs))
  local = jax.tree.map(lambda x: np.concatenate([x] * len(runs)), run_batch(config))
  return time_steps(program.train, program.initial(runs), sharding.global_batch(mesh, local),
                    steps)


class EngineSteps:
  """normstudy's engine stepping one run on one device as normstudy.main does: `block()` runs
  train.steps_per_dispatch steps in one compiled loop, `one_step()` one step per dispatch (how an
  evaluation, a telemetry step or the locate pass runs); each waits for its metrics. The batches
  cycle through a pool of `pool_size` random ones (encoders' with their masks)."""

  def __init__(self, config, pool_size: int = 4):
    m = config.model
    self.length = config.train.steps_per_dispatch
    self.mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    self.program = execution.ProgramSteps(config, self.mesh, num_runs=1)
    rng, shape = np.random.default_rng(0), (1, config.train.batch_size, m.max_len)
    self.pool = []
    for _ in range(pool_size):
      batch = {"tokens": rng.integers(0, m.vocab_size, shape, dtype=np.int32)}
      if not m.causal:
        batch["mask"] = rng.random(shape) < config.data.mask_prob
      self.pool.append(batch)
    self.state = self.program.initial([config])
    self.index = 0

  def block(self):
    batches = [self.pool[(self.index + j) % len(self.pool)] for j in range(self.length)]
    self.state, metrics = self.program.step_block(self.state,
                                                  self.program.block_work(batches, self.length))
    jax.device_get(metrics)
    self.index += self.length

  def one_step(self):
    batch = sharding.global_batch(self.mesh, self.pool[self.index % len(self.pool)])
    self.state, metrics = self.program.step(self.state, batch)
    jax.device_get(metrics)
    self.index += 1

  def params(self):
    state = self.state[0] if isinstance(self.state, list) else self.state
    return jax.device_get(state.params)

"""The optimizer against transcriptions of the published code and formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from normstudy.core import config as config_lib
from normstudy.core import optimizer as optimizer_lib
import inprocess


def _fairseq_polynomial_lr(num_updates, peak, end, warmup, total, power):
  """fairseq/optim/lr_scheduler/polynomial_decay_schedule.py, PolynomialDecayLRSchedule."""
  if warmup > 0 and num_updates <= warmup:
    return num_updates / float(warmup) * peak
  if num_updates >= total:
    return end
  pct_remaining = 1 - (num_updates - warmup) / (total - warmup)
  return (peak - end) * pct_remaining**power + end


class _FairseqAdam:
  """fairseq/optim/adam.py, Adam.step (one parameter group), in float64: the formula's exact
  arithmetic. (A float32 transcription differs from optax's float32 by rounding alone: fairseq
  applies the decay and the step as two additions, optax as one, ~14 ulp of a gain after 100
  steps.)"""

  def __init__(self, params, betas, eps, weight_decay):
    self.params, self.betas, self.eps, self.wd = params, betas, eps, weight_decay
    self.exp_avg = [np.zeros_like(p) for p in params]
    self.exp_avg_sq = [np.zeros_like(p) for p in params]
    self.step_count = 0
    self.lr = 0.0

  def step(self, grads):
    beta1, beta2 = self.betas
    self.step_count += 1
    for i, (p, g) in enumerate(zip(self.params, grads)):
      self.exp_avg[i] = self.exp_avg[i] * beta1 + g * (1 - beta1)
      self.exp_avg_sq[i] = (self.exp_avg_sq[i] * beta2
                            + g * g * (1 - beta2))
      denom = np.sqrt(self.exp_avg_sq[i]) + self.eps
      bias_correction1 = 1 - beta1**self.step_count
      bias_correction2 = 1 - beta2**self.step_count
      step_size = self.lr * math.sqrt(bias_correction2) / bias_correction1
      p = p - self.wd * self.lr * p  # decay first, on every parameter
      self.params[i] = p - step_size * self.exp_avg[i] / denom


def test_adam_fairseq_matches_fairseqs_adam_and_schedule_over_100_steps():
  opt = config_lib.default_config().optimizer
  opt.update(name="adam_fairseq", learning_rate=3e-3, end_learning_rate=1e-4, b1=0.9, b2=0.98,
             eps=1e-6, weight_decay=0.01, warmup_steps=10, schedule="polynomial", power=1.5,
             clip_norm=0.0)
  config = config_lib.default_config()
  config.optimizer = opt
  config.train.num_steps = 80  # the decay ends at step 80; steps 81-100 run at the end rate
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(7, 5)).astype(np.float32),
            "scale": np.ones(5, np.float32)}  # a norm gain: fairseq decays it too
  hp = inprocess.hyperparameters(config)
  mask = {"w": True, "scale": False}  # ignored by adam_fairseq
  tx = optimizer_lib.make_optimizer(opt, hp, mask)
  state = tx.init(params)
  update = jax.jit(tx.update)

  # fairseq's trainer calls lr_step_update(0) after building the scheduler, so update k uses the
  # rate set after update k - 1.
  reference = _FairseqAdam([params["w"].astype(np.float64), params["scale"].astype(np.float64)],
                           (0.9, 0.98), 1e-6, 0.01)
  reference.lr = _fairseq_polynomial_lr(0, 3e-3, 1e-4, 10, 80, 1.5)
  ours = jax.tree.map(jnp.asarray, params)
  worst = 0.0
  for k in range(100):
    grads = {"w": rng.normal(size=(7, 5)).astype(np.float32) * (1 + k % 3),
             "scale": rng.normal(size=5).astype(np.float32)}
    updates, state = update(grads, state, ours)
    ours = optax.apply_updates(ours, updates)
    reference.step([grads["w"], grads["scale"]])
    reference.lr = _fairseq_polynomial_lr(k + 1, 3e-3, 1e-4, 10, 80, 1.5)
    worst = max(worst, np.abs(np.asarray(ours["w"]) - reference.params[0]).max(),
                np.abs(np.asarray(ours["scale"]) - reference.params[1]).max())
  assert worst < 1e-6
  assert np.abs(np.asarray(ours["w"]) - params["w"]).max() > 0.02  # it really moved (100 steps near lr 3e-3)


@pytest.mark.parametrize("schedule", optimizer_lib.SCHEDULES.names())
def test_schedules_equal_optax_schedules_joined_after_warmup(schedule):
  config = config_lib.default_config()
  config.optimizer.update(learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=10,
                          schedule=schedule, power=2.0)
  config.train.num_steps = 110
  hp = inprocess.hyperparameters(config)
  decay = {
      "constant": optax.constant_schedule(1e-3),
      "linear": optax.linear_schedule(1e-3, 1e-4, 100),
      "cosine": optax.cosine_decay_schedule(1e-3, 100, alpha=0.1),
      "polynomial": optax.polynomial_schedule(1e-3, 1e-4, 2.0, 100),
  }[schedule]
  expected = optax.join_schedules([optax.linear_schedule(0.0, 1e-3, 10), decay], [10])
  for count in (0, 1, 5, 9, 10, 11, 50, 60, 109, 110, 150):
    got = float(optimizer_lib.learning_rate(schedule, hp, count))
    assert got == pytest.approx(float(expected(count)), rel=1e-5, abs=1e-12), count


def test_schedule_is_traced_data():
  config = config_lib.default_config()
  config.optimizer.update(schedule="linear", warmup_steps=4)
  config.train.num_steps = 20
  hp = inprocess.hyperparameters(config)
  stacked = {k: jnp.stack([v, v * 2]) for k, v in hp.items()}
  rates = jax.jit(jax.vmap(lambda h: optimizer_lib.learning_rate("linear", h, 2)))(stacked)
  # Two runs: peak 1e-3 and 2e-3, warm-ups 4 and 8 steps: step 2 is half and a quarter of peak.
  np.testing.assert_allclose(np.asarray(rates), [0.5e-3, 0.5e-3], rtol=1e-6)


def test_clip_norm_zero_is_exactly_no_clipping():
  config = config_lib.default_config()
  config.optimizer.update(name="adamw", clip_norm=None, weight_decay=0.0)
  hp = inprocess.hyperparameters(config)
  params = {"w": jnp.ones((3, 3))}
  grads = {"w": jnp.full((3, 3), 100.0)}
  tx = optimizer_lib.make_optimizer(config.optimizer, hp, {"w": True})
  plain = optax.chain(optax.scale_by_adam(0.9, 0.98, 1e-6),
                      optax.scale_by_schedule(lambda c: -optimizer_lib.learning_rate(
                          "polynomial", hp, c)))
  got, _ = tx.update(grads, tx.init(params), params)
  want, _ = plain.update(grads, plain.init(params), params)
  np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(want["w"]))


def test_adamw_decays_by_role_mask():
  config = config_lib.default_config()
  config.optimizer.update(name="adamw", weight_decay=0.5, learning_rate=0.1, clip_norm=0.0,
                          warmup_steps=0, schedule="constant")
  hp = inprocess.hyperparameters(config)
  params = {"w": jnp.full((2,), 3.0), "gain": jnp.full((2,), 5.0)}
  tx = optimizer_lib.make_optimizer(config.optimizer, hp, {"w": True, "gain": False})
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  # With zero gradients the whole update is the decay: -lr * wd * param, where the mask says.
  np.testing.assert_allclose(np.asarray(updates["w"]), -0.1 * 0.5 * 3.0, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(updates["gain"]), 0.0)


def test_adam_atan2_is_the_atan2_of_the_corrected_moments_over_50_steps():
  """Everett et al. 2024's update, a * atan2(m_hat, b * sqrt(v_hat)) with a = 4/pi and b = 1,
  decoupled decay by role, against a float64 loop; eps plays no part, and a gradient scaled by
  1000 gives the same steps (no epsilon to break the scale invariance)."""
  config = config_lib.default_config()
  config.optimizer.update(name="adam_atan2", learning_rate=1e-2, b1=0.9, b2=0.99,
                          weight_decay=0.1, warmup_steps=0, schedule="constant", clip_norm=0.0,
                          eps=0.5)  # a huge epsilon: it must change nothing
  rng = np.random.default_rng(1)
  params = {"w": rng.normal(size=(6, 4)).astype(np.float32), "scale": np.ones(4, np.float32)}
  mask = {"w": True, "scale": False}
  grads = [{"w": rng.normal(size=(6, 4)).astype(np.float32) * (1 + k % 4),
            "scale": rng.normal(size=4).astype(np.float32)} for k in range(50)]

  def ours(scale):
    hp = inprocess.hyperparameters(config)
    tx = optimizer_lib.make_optimizer(config.optimizer, hp, mask)
    state, p = tx.init(params), jax.tree.map(jnp.asarray, params)
    update = jax.jit(tx.update)
    for g in grads:
      updates, state = update(jax.tree.map(lambda x: x * scale, g), state, p)
      p = optax.apply_updates(p, updates)
    return jax.tree.map(np.asarray, p)

  ref = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in ref.items()}
  v = {k: np.zeros_like(x) for k, x in ref.items()}
  for t, g in enumerate(grads, start=1):
    for k in ref:
      m[k] = 0.9 * m[k] + 0.1 * g[k]
      v[k] = 0.99 * v[k] + 0.01 * g[k].astype(np.float64) ** 2
      step = (4 / math.pi) * np.arctan2(m[k] / (1 - 0.9**t), np.sqrt(v[k] / (1 - 0.99**t)))
      decay = 0.1 * ref[k] if mask[k] else 0.0
      ref[k] = ref[k] - 1e-2 * (step + decay)
  got = ours(1.0)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], atol=2e-6)
  scaled = ours(1000.0)
  for k in ref:
    np.testing.assert_allclose(scaled[k], got[k], atol=2e-6)
  assert np.abs(got["w"] - params["w"]).max() > 0.1  # it moved


def test_update_clipping_caps_each_tensors_update_rms_over_30_steps():
  """optimizer.update_clip = d: each parameter's AdamW update (direction plus decoupled decay,
  before the rate) divided by max(1, RMS / d) (Adafactor's update clipping), against a float64
  loop in which some steps are clipped and some not."""
  config = config_lib.default_config()
  config.optimizer.update(name="adamw", learning_rate=1e-2, b1=0.9, b2=0.99, eps=1e-8,
                          weight_decay=0.1, warmup_steps=0, schedule="constant", clip_norm=0.0,
                          update_clip=0.9)
  rng = np.random.default_rng(2)
  params = {"w": rng.normal(size=(6, 4)).astype(np.float32), "scale": np.ones(4, np.float32)}
  mask = {"w": True, "scale": False}
  # Heavy-tailed gradients: a few steps put a tensor's Adam direction above RMS 0.9.
  grads = [{"w": rng.standard_t(1.5, size=(6, 4)).astype(np.float32),
            "scale": rng.normal(size=4).astype(np.float32)} for _ in range(30)]
  hp = inprocess.hyperparameters(config)
  tx = optimizer_lib.make_optimizer(config.optimizer, hp, mask)
  state, ours = tx.init(params), jax.tree.map(jnp.asarray, params)
  update = jax.jit(tx.update)
  for g in grads:
    updates, state = update(g, state, ours)
    ours = optax.apply_updates(ours, updates)

  ref = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in ref.items()}
  v = {k: np.zeros_like(x) for k, x in ref.items()}
  clipped = 0
  for t, g in enumerate(grads, start=1):
    for k in ref:
      m[k] = 0.9 * m[k] + 0.1 * g[k]
      v[k] = 0.99 * v[k] + 0.01 * g[k].astype(np.float64) ** 2
      u = (m[k] / (1 - 0.9**t)) / (np.sqrt(v[k] / (1 - 0.99**t)) + 1e-8)
      u = u + (0.1 * ref[k] if mask[k] else 0.0)
      rms = np.sqrt(np.mean(u ** 2))
      clipped += rms > 0.9
      ref[k] = ref[k] - 1e-2 * u / max(1.0, rms / 0.9)
  assert 0 < clipped < 60  # the test exercises both branches
  for k in ref:
    np.testing.assert_allclose(np.asarray(ours[k]), ref[k], atol=2e-6)
  # Off (0, the default), the chain holds no clipping transform at all.
  config.optimizer.update_clip = 0.0
  off = optimizer_lib.make_optimizer(config.optimizer, hp, mask)
  assert len(off.init(params)) == len(tx.init(params)) - 1


class _OlmoSkipStep:
  """OLMo-core's SkipStepOptimizer (olmo_core/optim/skip_step_optimizer.py): the rings of the
  newest rolling_interval_length + 1 losses and grad norms, and get_step_factor, transcribed
  with Python lists and numpy (np.std with ddof=1 is torch.std's unbiased estimate)."""

  def __init__(self, rolling_interval_length=128, sigma_factor=6):
    self.length, self.sigma = rolling_interval_length, sigma_factor
    self.losses, self.grad_norms = [], []

  def step_factor(self, loss, grad_norm):
    for ring, value in ((self.losses, loss), (self.grad_norms, grad_norm)):
      ring.append(value)
      while len(ring) > self.length + 1:
        ring.pop(0)
    if len(self.losses) < max(20, self.length // 2):
      return 1.0
    z = [abs(ring[-1] - np.mean(ring[:-1])) / np.std(ring[:-1], ddof=1)
         for ring in (self.losses, self.grad_norms)]
    return float(z[0] <= self.sigma and z[1] <= self.sigma)


def test_skip_spikes_skips_what_olmo_cores_rule_skips_and_keeps_the_state():
  """300 steps of a noisy loss and grad norm with spikes injected (some before the rule has
  enough history, some in the loss only, some in the grad norm only): the same steps skipped as
  OLMo-core's transcription, a skipped step's update zero and the wrapped optimizer's state (its
  Adam moments) unchanged, the rest Adam's."""
  rng = np.random.default_rng(4)
  steps = 300
  losses = 3.0 + 0.05 * rng.normal(size=steps)
  norms = 1.0 + 0.1 * rng.normal(size=steps)
  for at in (10, 90, 150, 151, 240):
    losses[at] += 2.0
  for at in (120, 200):
    norms[at] *= 8.0
  inner = optax.adam(1e-2)
  tx = optimizer_lib.skip_spikes(inner, 6.0, 32)
  params = {"w": np.ones(3, np.float32)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  reference = _OlmoSkipStep(rolling_interval_length=32, sigma_factor=6)
  skipped = []
  for t in range(steps):
    grads = {"w": rng.normal(size=3).astype(np.float32)}
    before = state
    updates, state = update(grads, state, params, loss=np.float32(losses[t]),
                            grad_norm=np.float32(norms[t]))
    take = reference.step_factor(float(np.float32(losses[t])), float(np.float32(norms[t])))
    if not take:
      skipped.append(t)
      assert not np.asarray(updates["w"]).any()
      for new, old in zip(jax.tree.leaves(state.inner), jax.tree.leaves(before.inner)):
        np.testing.assert_array_equal(new, old)
    else:
      assert np.asarray(updates["w"]).any()
  assert int(state.skips) == len(skipped)
  # The spikes after the history fills (32 // 2 -> 20 values) are skipped; step 10's is not.
  assert {90, 120, 150, 200, 240} <= set(skipped) and 10 not in skipped
  assert len(skipped) <= 8, skipped

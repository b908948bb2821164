"""The train step: clipping, fp16 dynamic loss scaling, skipped updates, schedules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from normstudy import model as model_lib
from normstudy import optimizer as optimizer_lib
from normstudy import precision
from normstudy import steps as steps_lib


def _batch(seed=0, causal=True):
  rng = np.random.default_rng(seed)
  batch = {"tokens": jnp.asarray(rng.integers(0, 32, (4, 16)), jnp.int32)}
  if not causal:
    batch["mask"] = jnp.asarray(rng.random((4, 16)) < 0.3)
  return batch


def _independent_loss(config, params, batch):
  """Cross-entropy written out with log-softmax, not through steps.cross_entropy."""
  logits = model_lib.forward(config.model, params, batch["tokens"], batch.get("mask"))
  logp = jax.nn.log_softmax(logits, axis=-1)
  if config.model.causal:
    picked = jnp.take_along_axis(logp[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
    return -picked.mean()
  picked = jnp.take_along_axis(logp, batch["tokens"][..., None], -1)[..., 0]
  mask = batch["mask"]
  return -(picked * mask).sum() / mask.sum()


def _adam_state(opt_state):
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
      s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
  assert len(found) == 1
  return found[0]


@pytest.mark.parametrize("causal", [True, False])
def test_loss_and_grad_norm_match_independent_computation(make_config, causal):
  config = make_config(causal=causal)
  config.optimizer.clip_norm = 0.0
  state = steps_lib.create_train_state(config)
  batch = _batch(causal=causal)
  expected_loss = _independent_loss(config, state.params, batch)
  grads = jax.grad(lambda p: _independent_loss(config, p, batch))(state.params)
  expected_norm = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)))
                              for g in jax.tree.leaves(grads)))
  _, metrics = jax.jit(steps_lib.make_train_step(config))(state, batch)
  assert float(metrics["loss"]) == pytest.approx(float(expected_loss), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(expected_norm, rel=1e-4)
  assert not bool(metrics["clipped"])


def test_clipping_bounds_the_gradient_adam_sees(make_config):
  config = make_config()
  config.optimizer.update(clip_norm=0.05, b2=0.98)
  state = steps_lib.create_train_state(config)
  new_state, metrics = jax.jit(steps_lib.make_train_step(config))(state, _batch())
  assert float(metrics["grad_norm"]) > 0.05 and bool(metrics["clipped"])
  # After one step Adam's second moment is (1 - b2) g^2 of the gradient it was given.
  nu = _adam_state(new_state.opt_state).nu
  seen_norm = np.sqrt(sum(np.sum(np.asarray(v, np.float64)) for v in jax.tree.leaves(nu))
                      / (1 - 0.98))
  assert seen_norm == pytest.approx(0.05, rel=1e-4)

  config.optimizer.clip_norm = 1000.0
  state = steps_lib.create_train_state(config)
  new_state, metrics = jax.jit(steps_lib.make_train_step(config))(state, _batch())
  assert not bool(metrics["clipped"])
  nu = _adam_state(new_state.opt_state).nu
  seen_norm = np.sqrt(sum(np.sum(np.asarray(v, np.float64)) for v in jax.tree.leaves(nu))
                      / (1 - 0.98))
  assert seen_norm == pytest.approx(float(metrics["grad_norm"]), rel=1e-4)


def test_float16_overflow_skips_update_and_halves_scale(make_config):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.initial_scale = 2.0**40  # the scaled fp16 backward overflows
  state = steps_lib.create_train_state(config)
  before = jax.tree.map(np.asarray, (state.params, state.opt_state))
  new_state, metrics = jax.jit(steps_lib.make_train_step(config))(state, _batch())
  assert bool(metrics["skipped"]) and int(new_state.skipped_total) == 1
  assert float(metrics["loss_scale"]) == 2.0**40
  assert float(new_state.loss_scale.scale) == 2.0**39
  assert int(new_state.opt_step) == 0 and int(new_state.step) == 1
  after = jax.tree.map(np.asarray, (new_state.params, new_state.opt_state))
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(a, b)


def test_float16_scale_grows_after_growth_interval(make_config):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.update(initial_scale=128.0, growth_interval=3)
  state = steps_lib.create_train_state(config)
  step = jax.jit(steps_lib.make_train_step(config))
  scales = []
  for i in range(7):
    state, metrics = step(state, _batch(i))
    assert not bool(metrics["skipped"])
    scales.append(float(metrics["loss_scale"]))
  assert scales == [128, 128, 128, 256, 256, 256, 512]
  # And the fp16 step still learns: gradients were unscaled correctly.
  params32 = state.params
  assert np.isfinite(np.asarray(jax.tree.leaves(params32)[0])).all()


def test_float16_gradients_match_float32_after_unscaling(make_config):
  config16 = make_config(dtype="float16")
  config16.optimizer.clip_norm = 0.0
  config32 = make_config(dtype="float32")
  config32.optimizer.clip_norm = 0.0
  state16 = steps_lib.create_train_state(config16)
  state32 = steps_lib.create_train_state(config32)
  _, m16 = jax.jit(steps_lib.make_train_step(config16))(state16, _batch())
  _, m32 = jax.jit(steps_lib.make_train_step(config32))(state32, _batch())
  assert float(m16["loss_scale"]) == 128.0 and float(m32["loss_scale"]) == 1.0
  assert float(m16["grad_norm"]) == pytest.approx(float(m32["grad_norm"]), rel=0.02)


def test_loss_scale_update_rules():
  ls = precision.LossScale(scale=jnp.float32(1.0), good_steps=jnp.int32(5), dynamic=True,
                           growth_interval=10, min_scale=0.5)
  halved, underflow = precision.update(ls, jnp.asarray(False))
  assert float(halved.scale) == 0.5 and int(halved.good_steps) == 0 and not bool(underflow)
  floor, underflow = precision.update(halved, jnp.asarray(False))
  assert float(floor.scale) == 0.5 and bool(underflow)  # clamped at min_scale, flagged
  static = precision.LossScale(scale=jnp.float32(1.0), good_steps=jnp.int32(0))
  same, _ = precision.update(static, jnp.asarray(False))
  assert float(same.scale) == 1.0


@pytest.mark.parametrize("schedule", optimizer_lib.SCHEDULES)
def test_schedules_warm_up_then_decay(make_config, schedule):
  opt = make_config().optimizer
  opt.update(learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=10, schedule=schedule)
  lr = optimizer_lib.learning_rate_schedule(opt, num_steps=110)
  assert float(lr(0)) == 0.0
  assert float(lr(5)) == pytest.approx(5e-4)
  assert float(lr(10)) == pytest.approx(1e-3)
  expected_end = 1e-3 if schedule == "constant" else 1e-4
  assert float(lr(110)) == pytest.approx(expected_end, rel=1e-4)
  if schedule in ("linear", "polynomial"):
    assert float(lr(60)) == pytest.approx(5.5e-4, rel=1e-4)


def test_adamw_decays_weights_but_not_norms(make_config):
  config = make_config()
  config.optimizer.update(name="adamw", weight_decay=0.5, learning_rate=0.1, clip_norm=0.0)
  params = model_lib.init_params(config.model, 0)
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  # With zero gradients the whole update is the decay: -lr * wd * param.
  np.testing.assert_allclose(np.asarray(updates["embedding"]),
                             -0.1 * 0.5 * np.asarray(params["embedding"]), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(updates["layers"]["mlp_norm"]["scale"]), 0.0)

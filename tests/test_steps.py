"""The train step: loss, clipping, fp16 dynamic loss scaling, skipped updates, a run's life."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from normstudy.core import life
from normstudy.core import model as model_lib
from normstudy.core import precision
from normstudy.core import steps as steps_lib
from normstudy.engine import execution
from normstudy.engine import platform
from normstudy.engine import sharding
from conftest import USER_COMPILER_OPTIONS
import inprocess


def _batch(seed=0, causal=True):
  rng = np.random.default_rng(seed)
  batch = {"tokens": jnp.asarray(rng.integers(0, 32, (4, 16)), jnp.int32)}
  if not causal:
    batch["mask"] = jnp.asarray(rng.random((4, 16)) < 0.3)
  return batch


def _independent_loss(config, params, batch):
  """Cross-entropy written out with log-softmax, not through normstudy.core.loss."""
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


def _step(config, telemetry_on=False):
  return jax.jit(steps_lib.make_train_step(config, telemetry_on))


@pytest.mark.parametrize("causal", [True, False])
def test_loss_and_grad_norm_match_independent_computation(make_config, causal):
  config = make_config(causal=causal)
  config.optimizer.clip_norm = 0.0
  state = inprocess.create_train_state(config)
  batch = _batch(causal=causal)
  expected_loss, grads = jax.jit(jax.value_and_grad(
      lambda p: _independent_loss(config, p, batch)))(state.params)
  expected_norm = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)))
                              for g in jax.tree.leaves(grads)))
  _, metrics = _step(config)(state, batch)
  assert float(metrics["loss"]) == pytest.approx(float(expected_loss), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(expected_norm, rel=1e-4)
  assert not bool(metrics["clipped"])


def _seen_norm(state, b2):
  # After one step Adam's second moment is (1 - b2) g^2 of the gradient it was given.
  nu = _adam_state(state.opt_state).nu
  return np.sqrt(sum(np.sum(np.asarray(v, np.float64)) for v in jax.tree.leaves(nu)) / (1 - b2))


def test_clipping_bounds_the_gradient_adam_sees(make_config):
  config = make_config()
  config.optimizer.update(clip_norm=0.05, b2=0.98)
  new_state, metrics = _step(config)(inprocess.create_train_state(config), _batch())
  assert float(metrics["grad_norm"]) > 0.05 and bool(metrics["clipped"])
  assert _seen_norm(new_state, 0.98) == pytest.approx(0.05, rel=1e-4)
  config.optimizer.clip_norm = 1000.0
  new_state, metrics = _step(config)(inprocess.create_train_state(config), _batch())
  assert not bool(metrics["clipped"])
  assert _seen_norm(new_state, 0.98) == pytest.approx(float(metrics["grad_norm"]), rel=1e-4)


def test_float16_overflow_skips_update_and_halves_scale(make_config):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.initial_scale = 2.0**40  # the scaled fp16 backward overflows
  state = inprocess.create_train_state(config)
  before = jax.tree.map(np.asarray, (state.params, state.opt_state))
  new_state, metrics = _step(config)(state, _batch())
  assert bool(metrics["skipped"]) and int(new_state.skipped_total) == 1
  assert float(metrics["loss_scale"]) == 2.0**40
  assert float(new_state.loss_scale.scale) == 2.0**39
  assert int(new_state.opt_step) == 0 and int(new_state.step) == 1
  assert int(new_state.status) == life.CODE_RUNNING
  after = jax.tree.map(np.asarray, (new_state.params, new_state.opt_state))
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(a, b)


def test_float16_scale_grows_after_growth_interval_and_the_run_learns(make_config):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.update(initial_scale=128.0, growth_interval=3)
  state = inprocess.create_train_state(config)
  step = _step(config)
  scales, losses = [], []
  for _ in range(12):
    state, metrics = step(state, _batch(0))
    assert not bool(metrics["skipped"])
    scales.append(float(metrics["loss_scale"]))
    losses.append(float(metrics["loss"]))
  assert scales[:7] == [128, 128, 128, 256, 256, 256, 512]
  # Gradients were unscaled correctly: the same batch's loss falls as it would in float32.
  assert losses[-1] < losses[0] - 0.5, losses


def test_float16_gradients_match_float32_after_unscaling(make_config):
  config16 = make_config(dtype="float16")
  config16.optimizer.clip_norm = 0.0
  config32 = make_config(dtype="float32")
  config32.optimizer.clip_norm = 0.0
  _, m16 = _step(config16)(inprocess.create_train_state(config16), _batch())
  _, m32 = _step(config32)(inprocess.create_train_state(config32), _batch())
  assert float(m16["loss_scale"]) == 128.0 and float(m32["loss_scale"]) == 1.0
  assert float(m16["grad_norm"]) == pytest.approx(float(m32["grad_norm"]), rel=0.02)


def test_loss_scale_update_rules():
  ls = precision.LossScale(scale=jnp.float32(1.0), good_steps=jnp.int32(5), dynamic=True,
                           growth_interval=jnp.int32(10), min_scale=jnp.float32(0.5))
  halved, underflow = precision.update(ls, jnp.asarray(False))
  assert float(halved.scale) == 0.5 and int(halved.good_steps) == 0 and not bool(underflow)
  floor, underflow = precision.update(halved, jnp.asarray(False))
  assert float(floor.scale) == 0.5 and bool(underflow)  # clamped at min_scale, flagged
  static = precision.LossScale(scale=jnp.float32(1.0), good_steps=jnp.int32(0),
                               growth_interval=jnp.int32(10), min_scale=jnp.float32(0.5))
  same, _ = precision.update(static, jnp.asarray(False))
  assert float(same.scale) == 1.0


def _poisoned(state):
  """The state with one embedding entry NaN: every gradient is non-finite from then on."""
  params = dict(state.params)
  params["embedding"] = params["embedding"].at[0, 0].set(jnp.nan)
  return state.replace(params=params)


@pytest.mark.parametrize("policy,limit,halts_at,status", [
    ("halt", 10, 1, life.CODE_HALTED_NONFINITE),
    ("skip", 2, 3, life.CODE_HALTED_SKIPS),
])
def test_a_halted_run_is_frozen(make_config, policy, limit, halts_at, status):
  config = make_config()
  config.train.update(on_nonfinite=policy, max_consecutive_skips=limit)
  state = _poisoned(inprocess.create_train_state(config))
  step = _step(config)
  frozen = jax.tree.map(np.asarray, state.params)
  seen = []
  for _ in range(5):
    state, metrics = step(state, {"tokens": jnp.zeros((4, 16), jnp.int32)})
    seen.append((bool(metrics["active"]), int(metrics["status"])))
  assert seen[halts_at - 1] == (True, status)
  assert all(active for active, _ in seen[:halts_at])
  assert not any(active for active, _ in seen[halts_at:])  # frozen: later steps are no-ops
  assert int(state.halt_step) == halts_at and int(state.step) == halts_at
  for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(jax.tree.map(np.asarray,
                                                                         state.params))):
    np.testing.assert_array_equal(a, b)


def test_float16_halts_at_the_loss_scale_floor(make_config):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.update(initial_scale=4.0, min_scale=1.0)
  state = _poisoned(inprocess.create_train_state(config))
  step = _step(config)
  statuses, scales = [], []
  for _ in range(4):
    state, metrics = step(state, {"tokens": jnp.zeros((4, 16), jnp.int32)})
    statuses.append(int(metrics["status"]))
    scales.append(float(metrics["loss_scale"]))
  # 4 -> 2 -> 1; the next overflow would go below the floor: fairseq stops there.
  assert scales[:3] == [4.0, 2.0, 1.0]
  assert statuses[:3] == [life.CODE_RUNNING, life.CODE_RUNNING, life.CODE_HALTED_SCALE]


@pytest.mark.parametrize("count_skipped", [True, False])
def test_num_steps_counts_train_steps_or_applied_updates(make_config, count_skipped):
  config = make_config(dtype="float16")
  config.optimizer.loss_scale.initial_scale = 2.0**40  # overflows until the scale falls
  config.train.update(num_steps=3, count_skipped_steps=count_skipped)
  state = inprocess.create_train_state(config)
  step = _step(config)
  for _ in range(40):
    state, _ = step(state, _batch())
    if int(state.status) != life.CODE_RUNNING:
      break
  assert int(state.status) == life.CODE_FINISHED
  assert int(state.skipped_total) > 0
  if count_skipped:
    assert int(state.step) == 3 and int(state.opt_step) < 3
  else:  # fairseq's max_update: applied updates
    assert int(state.opt_step) == 3 and int(state.step) == 3 + int(state.skipped_total)


def _program(config):
  """The compiled one-run steps as the train loop holds them (normstudy.engine.execution)."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  steps = execution.ProgramSteps(config, mesh, 1)
  return steps, steps.initial([config])


def _stepped_batches(n):
  return [{"tokens": np.asarray(_batch(seed)["tokens"])[None]} for seed in range(n)]


def test_a_program_traces_its_step_and_its_initializer_once(make_config, monkeypatch):
  """The block's buffers take their shapes from the trace of the train step that the loop's
  body inlines, and the abstract state from the trace the initializer's first call reuses:
  each traced once (the block lowered, not compiled)."""
  traced = {"train_step": 0, "init_state": 0}

  def counting(name, fn):
    def counted(*args, **kwargs):
      traced[name] += 1
      return fn(*args, **kwargs)
    return counted

  make_train_step, init_state = steps_lib.make_train_step, steps_lib.init_state
  monkeypatch.setattr(steps_lib, "make_train_step",
                      lambda *a, **k: counting("train_step", make_train_step(*a, **k)))
  monkeypatch.setattr(steps_lib, "init_state", counting("init_state", init_state))
  monkeypatch.setattr(execution, "_KEPT", {})  # this program built here, not kept from before
  config = make_config()
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  steps = execution.ProgramSteps(config, mesh, 1)
  traced.update(train_step=0, init_state=0)  # the shardings' own (boxed) trace is not the claim
  abstract = steps.abstract([config])
  steps.initial([config])
  with jax.set_mesh(mesh):
    steps.block.lower(abstract, steps.block_work(_stepped_batches(2), 4))
  assert traced == {"train_step": 1, "init_state": 1}


@pytest.mark.slow  # compiles at XLA's full optimization, as a user's process does
@pytest.mark.parametrize("scenario", ["overflows then learns", "halts inside the block"])
def test_a_block_of_steps_is_the_same_steps_one_at_a_time(make_config, monkeypatch, scenario):
  """make_train_block against train_step's own compiled program stepped one at a time: every
  metric of every step and the state after them bit for bit, the entries past the block's
  count zero, and a failed step's sites the locate step's flags on the state after it. Both
  compiled as a user's process compiles them (the suite's faster emitters round a loop's body
  differently from the program alone)."""
  monkeypatch.setattr(platform, "CPU_COMPILER_OPTIONS",
                      {**platform.CPU_COMPILER_OPTIONS, **USER_COMPILER_OPTIONS})
  config = make_config(dtype="float16")
  config.optimizer.update(learning_rate=3e-2, warmup_steps=2)
  if scenario == "overflows then learns":
    config.optimizer.loss_scale.initial_scale = 2.0**20  # overflows for a few steps first
  else:
    config.optimizer.loss_scale.update(initial_scale=4.0, min_scale=1.0)
  steps, state = _program(config)
  if scenario == "halts inside the block":
    state = state.replace(params={**state.params, "embedding":
                                  state.params["embedding"].at[0, 0, 0].set(jnp.nan)})
  batches = _stepped_batches(7)
  length = 9  # compiled for 9, given 7: the count is traced
  single = jax.tree.map(jnp.copy, state)
  seen, located = [], {}
  for j, batch in enumerate(batches):
    single, metrics = steps.step(single, jax.device_put(batch))
    seen.append(jax.device_get(metrics))
    if bool(metrics["skipped"][0]) and bool(metrics["active"][0]):
      located[j] = jax.device_get(steps.locate(single, jax.device_put(batch)))
  assert located, "no step failed: the scenario tests no located failure"
  blocked, block_metrics = steps.step_block(state, steps.block_work(batches, length))
  block_metrics = jax.device_get(block_metrics)
  sites = block_metrics.pop("sites")
  for key, values in block_metrics.items():
    assert values.shape[:2] == (1, length), key
    np.testing.assert_array_equal(values[0, :7], np.stack([m[key][0] for m in seen]),
                                  err_msg=key)
    np.testing.assert_array_equal(values[0, 7:], np.zeros_like(values[0, 7:]), err_msg=key)
  for j, flags in located.items():
    for want, got in zip(jax.tree.leaves(flags), jax.tree.leaves(sites)):
      np.testing.assert_array_equal(got[0, j], want[0])
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(blocked)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  if scenario == "halts inside the block":
    active = block_metrics["active"][0, :7]
    assert active[0] and not active.all()  # it halted inside the block, then stood still
    assert int(blocked.status[0]) == life.CODE_HALTED_SCALE


@pytest.mark.slow
def test_skip_spikes_in_the_train_step_counts_skips_and_otherwise_changes_nothing(make_config):
  """optimizer.skip_spikes wraps the optimizer: with no spike the trajectory is the plain one
  (to rounding: the wrapped step is another program); with sigma so small that every step after
  the history fills is a spike, the 20th update and every later one are skipped (the loss on
  the fixed batch stays from step 20 on) and counted in spike_skips."""
  from conftest import train_losses
  configs = {}
  for name, sigma in (("plain", 0.0), ("watched", 6.0), ("strict", 1e-9)):
    configs[name] = make_config()
    configs[name].optimizer.update(skip_spikes=sigma, skip_spikes_window=32)  # judges from 20
    configs[name].train.num_steps = 40
  losses_plain, metrics = train_losses(configs["plain"], 26)
  assert "spike_skips" not in metrics
  losses_watched, metrics = train_losses(configs["watched"], 26)
  np.testing.assert_allclose(losses_watched, losses_plain, rtol=2e-6)
  assert int(metrics["spike_skips"]) == 0
  losses_strict, metrics = train_losses(configs["strict"], 26)
  np.testing.assert_allclose(losses_strict[:20], losses_plain[:20], rtol=2e-6)
  assert len(set(losses_strict[19:])) == 1 and losses_plain[25] < losses_plain[19]
  assert int(metrics["spike_skips"]) == 7  # steps 20 to 26

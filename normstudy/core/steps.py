"""The train state and the train, eval and locate steps: pure functions of (state, batch).

A run's hyperparameters (peak learning rate, clip norm, weight decay, warm-up, Adam's betas and
eps) and its seed are arrays in the state, and a run decides its own life inside the step
(finished, or halted by its non-finite policy or its loss-scale floor; a stopped run is frozen).
So one compiled step serves K runs stacked on a leading axis (`jax.vmap`, normstudy.engine.train),
and a single run is the case K = 1. Being pure (every random number derived from the state) is what
lets the loop resume bit-exactly.
"""

import dataclasses
from typing import Any

from flax import struct
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from normstudy.core import life
from normstudy.core import loss as loss_lib
from normstudy.core import model as model_lib
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import parametrizations
from normstudy.core import placements
from normstudy.core import precision
from normstudy.core import telemetry
from normstudy.records import keys

@struct.dataclass
class TrainState:
  step: jax.Array  # int32: train steps taken (batches consumed), skipped ones included
  opt_step: jax.Array  # int32: updates applied; drives the learning-rate schedule
  params: Any
  opt_state: Any
  loss_scale: precision.LossScale
  skipped_total: jax.Array  # int32: updates skipped for non-finite gradients so far
  consecutive_skips: jax.Array  # int32: skipped updates in a row, up to this step
  rng: jax.Array  # the dropout key's data (uint32 [2], `dropout_key`); each step folds in `step`
  hparams: dict  # float32 scalars (normstudy.core.per_run.FIELDS, group hparams)
  limits: dict  # num_steps, count_skipped_steps, halt_on_nonfinite, max_consecutive_skips
  status: jax.Array  # int32: a normstudy.core.life code (running, finished, halted and why)
  halt_step: jax.Array  # int32: the step that halted the run (0 while it has not)


def init_state(config, values: dict, params=None) -> TrainState:
  """A fresh state from a run's (possibly traced) `per_run.run_values`. Parameters come from
  key(seed) unless given (boxed or not); dropout keys from key(seed + 1), kept in the state as
  its raw data (a checkpoint holds plain uint32 arrays, as before typed keys)."""
  cfg = model_lib.ModelConfig.create(config.model)
  seed, hparams = values["seed"], values["hparams"]
  if params is None:
    params = model_lib.boxed_init(cfg)(jax.random.key(seed))
  tx = optimizer_lib.make_optimizer(config.optimizer, hparams, model_lib.decay_mask(cfg),
                                    *model_lib.optimizer_multipliers(cfg))
  zero = jnp.zeros((), jnp.int32)
  dynamic = config.model.dtype == "float16" and config.optimizer.loss_scale.kind == "dynamic"
  ls = values["loss_scale"]
  return TrainState(
      step=zero, opt_step=zero, params=params, opt_state=tx.init(params),
      loss_scale=precision.LossScale(
          scale=jnp.where(dynamic, ls["initial_scale"], 1.0).astype(jnp.float32),
          good_steps=zero, growth_interval=ls["growth_interval"], min_scale=ls["min_scale"],
          dynamic=dynamic),
      skipped_total=zero, consecutive_skips=zero, rng=jax.random.key_data(jax.random.key(seed + 1)),
      hparams=hparams, limits=values["limits"], status=zero, halt_step=zero)


def unboxed(tree):
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.Partitioned)
                      else x, tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def dropout_key(state: TrainState, step) -> jax.Array:
  """The dropout key of train step `step`: the run's key with the step folded in."""
  return jax.random.fold_in(jax.random.wrap_key_data(state.rng), step)


def _tree_where(condition, new, old):
  return jax.tree.map(lambda n, o: jnp.where(condition, n, o), new, old)


def _model(cfg, probe=telemetry.OFF):
  return model_lib.Transformer(cfg, deterministic=cfg.dropout == 0, probe=probe)


def _advance_life(state: TrainState, finite, scale_underflow):
  """The run's life after a step that was `finite` or not (normstudy.core.life): (step, opt_step,
  consecutive skips, status code, halted). float16 runs (their loss scaled) skip overflowing
  steps through the loss scaler and halt, as fairseq does, when the scale would pass its floor;
  the others follow config.train.on_nonfinite (halt, or skip up to max_consecutive_skips in a
  row)."""
  limits = state.limits
  step = state.step + 1
  opt_step = state.opt_step + finite.astype(jnp.int32)
  consecutive = jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32)
  if state.loss_scale.dynamic:
    halt, reason = scale_underflow, life.CODE_HALTED_SCALE
  else:
    halt = jnp.where(limits["halt_on_nonfinite"], ~finite,
                     consecutive > limits["max_consecutive_skips"])
    reason = jnp.where(limits["halt_on_nonfinite"], life.CODE_HALTED_NONFINITE,
                       life.CODE_HALTED_SKIPS)
  done = reached_end(step, opt_step, limits)
  status = jnp.where(halt, reason, jnp.where(done, life.CODE_FINISHED, life.CODE_RUNNING))
  return step, opt_step, consecutive, status.astype(jnp.int32), halt


def reached_end(step, opt_step, limits) -> jax.Array:
  """Whether a run at `step` train steps and `opt_step` applied updates has taken its
  num_steps: counted in train steps, skipped ones included, or in applied updates
  (config.train.count_skipped_steps; `limits`: the state's)."""
  return jnp.where(limits["count_skipped_steps"], step, opt_step) >= limits["num_steps"]


def _model_config(config, fusion_boundaries: bool):
  """The model's hashable config, with the compiler's fusion boundaries
  (normstudy.engine.platform)."""
  return dataclasses.replace(model_lib.ModelConfig.create(config.model),
                             fusion_boundaries=fusion_boundaries)


def _gradients(cfg, model, loss_cfg, telemetry_on: bool, qk_clip_on: bool):
  """gradients(state, batch) -> (unscaled gradients, loss, observed): observed (stopped
  gradients) is the loss terms, what telemetry sowed, the logits (with telemetry) and each
  head's largest logit (with QK-clip)."""

  def gradients(state, batch):
    scale, float16 = state.loss_scale.scale, state.loss_scale.dynamic

    def scaled_loss(params):
      inputs = ({"params": params}, batch["tokens"], batch.get("mask"))
      rngs = {"dropout": dropout_key(state, state.step)}
      collections = [telemetry.STATS] * telemetry_on + [telemetry.QK_CLIP] * qk_clip_on
      sown = heads = {}
      if collections:
        logits, variables = model.apply(*inputs, rngs=rngs, mutable=collections)
        sown = variables.get(telemetry.STATS, {})
        heads = telemetry.head_logit_max(cfg, variables[telemetry.QK_CLIP]) if qk_clip_on else {}
      else:
        logits = model.apply(*inputs, rngs=rngs)
      loss, terms = loss_lib.objective(cfg, loss_cfg, logits, batch)
      observed = jax.lax.stop_gradient((terms, sown, logits if telemetry_on else None, heads))
      # float32/bfloat16 skip the scaling passes (the scale is 1 and static there).
      scaled = loss * scale if float16 else loss
      if not unit_backward:
        return scaled, (loss, (observed, None))
      backward = jax.lax.stop_gradient(backward_scale(logits, batch))
      return scaled * backward, (loss, (observed, backward))

    grads, (loss, (observed, backward)) = jax.grad(scaled_loss, has_aux=True)(state.params)
    if float16:
      grads = jax.tree.map(lambda g: g / scale, grads)
    if unit_backward:  # undone in float32: what the clip and the optimizer see is the gradient
      grads = jax.tree.map(lambda g: g / backward, grads)
    return grads, loss, observed

  unit_backward = parametrizations.scales_loss_backward(cfg)

  def backward_scale(logits, batch):
    """The parametrization's backward scale of the loss (u-muP's unit-scaled cross entropy;
    normstudy.core.parametrizations.loss_backward_scale)."""
    _, _, weights = loss_lib.targets(cfg, logits, batch)
    return jnp.asarray(parametrizations.loss_backward_scale(cfg, jnp.sum(weights)), jnp.float32)

  return gradients


def make_train_step(config, telemetry_on: bool = False, fusion_boundaries: bool = False):
  """Returns train_step(state, batch) -> (state, metrics) for one run (vmap it for K).

  metrics: loss (cross entropy), grad_norm (unscaled, before clipping), update_norm (the
  update the optimizer computed, applied only when the step is finite), clipped, lr,
  loss_scale (the scale this step's loss was multiplied by), skipped, skipped_total, active
  (the run was running before this step; the others are frozen and report nothing new),
  status, and with `telemetry_on` the per-layer arrays of normstudy.core.telemetry under
  "telemetry". The state update is the same computation either way. Every per-run value is read
  from the state (normstudy.core.per_run), never from `config`, which is the first run's; so is
  whether the loss is scaled (float16: the state's loss scale is dynamic).
  `fusion_boundaries`: normstudy.engine.platform's choice for the devices it is compiled for.
  """
  cfg = _model_config(config, fusion_boundaries)
  mask = model_lib.decay_mask(model_lib.ModelConfig.create(config.model))
  multipliers = model_lib.optimizer_multipliers(config.model)
  model = _model(cfg, telemetry.Probe(stats=telemetry_on))
  opt_cfg, loss_cfg = config.optimizer, config.loss
  qk_clip_on = config.model.qk_clip > 0
  on_sphere = placements.get(config.model.placement).unit_sphere

  gradients = _gradients(cfg, model, loss_cfg, telemetry_on, qk_clip_on)

  def train_step(state: TrainState, batch):
    hp = state.hparams
    grads, loss, (terms, sown, logits, heads) = gradients(state, batch)
    finite = jnp.logical_and(precision.all_finite(grads), jnp.isfinite(loss))
    grad_norm = optax.tree.norm(grads)
    tx = optimizer_lib.make_optimizer(opt_cfg, hp, mask, *multipliers)
    spikes = {keys.LOSS: loss, keys.GRAD_NORM: grad_norm} if opt_cfg.skip_spikes > 0 else {}
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params, **spikes)
    new_params = optax.apply_updates(state.params, updates)
    if qk_clip_on:
      new_params = qk_clip(cfg, new_params, heads, config.model.qk_clip)
    if on_sphere:  # nGPT: the updated matrices back onto the unit sphere
      new_params = model_lib.onto_sphere(cfg, new_params)
    loss_scale, scale_underflow = precision.update(state.loss_scale, finite)
    step, opt_step, consecutive, status, halt = _advance_life(state, finite, scale_underflow)
    updated = state.replace(
        step=step, opt_step=opt_step,
        params=_tree_where(finite, new_params, state.params),
        opt_state=_tree_where(finite, new_opt_state, state.opt_state),
        loss_scale=loss_scale,
        skipped_total=state.skipped_total + (~finite).astype(jnp.int32),
        consecutive_skips=consecutive, status=status,
        halt_step=jnp.where(halt, step, 0).astype(jnp.int32))
    active = state.status == life.CODE_RUNNING
    new_state = _tree_where(active, updated, state)  # a stopped run stays as it stopped
    metrics = {
        **terms,
        keys.GRAD_NORM: grad_norm,
        keys.UPDATE_NORM: optax.tree.norm(updates),
        keys.CLIPPED: jnp.logical_and(hp["clip_norm"] > 0, grad_norm > hp["clip_norm"]),
        keys.LR: optimizer_lib.learning_rate(opt_cfg.schedule, hp, state.opt_step),
        keys.LOSS_SCALE: state.loss_scale.scale,
        keys.SKIPPED: ~finite,
        keys.SKIPPED_TOTAL: updated.skipped_total,
        keys.ACTIVE: active,
        keys.STATUS: updated.status,
    }
    if qk_clip_on:  # heads whose W_q and W_k this step rescaled
      metrics[keys.QK_CLIPPED_HEADS] = jnp.sum(heads > config.model.qk_clip).astype(jnp.int32)
    if spikes:  # updates skipped as spikes so far (the run's, frozen with it)
      metrics[keys.SPIKE_SKIPS] = new_state.opt_state.skips
    if telemetry_on:
      metrics[keys.TELEMETRY] = telemetry.collect(cfg, sown, logits, grads, updates, state.params)
    return new_state, metrics

  return train_step


def qk_clip(cfg, params, head_logit_max, tau: float):
  """QK-clip (Kimi Team 2025, Kimi K2, section 2.1, MuonClip): for each head whose largest logit
  S of the step exceeds tau, W_q and W_k (with their biases, so that q and k scale exactly)
  times sqrt(tau / S): the head's logits on the same input shrink by tau / S. Other heads and
  parameters are untouched. `head_logit_max`: [num_layers, num_heads]."""
  factor = jnp.sqrt(jnp.where(head_logit_max > tau, tau / head_logit_max, 1.0))  # [L, H]

  def scaled(attention, f):  # f [H], or [L, H] for a scanned stack
    out = dict(attention)
    for name in ("query", "key"):
      kernel = attention[name]  # [(L,) d, H, k]
      out[name] = kernel * jnp.expand_dims(f, (-3, -1)).astype(kernel.dtype)
      if f"{name}_bias" in attention:  # [(L,) H, k]
        bias = attention[f"{name}_bias"]
        out[f"{name}_bias"] = bias * f[..., None].astype(bias.dtype)
    return out

  params = dict(params)
  if cfg.scanned:
    layers = dict(params["layers"])
    layers["attention"] = scaled(layers["attention"], factor)
    params["layers"] = layers
    return params
  for i in range(cfg.num_layers):
    layer = dict(params[f"layer_{i}"])
    layer["attention"] = scaled(layer["attention"], factor[i])
    params[f"layer_{i}"] = layer
  return params


def make_eval_step(config, fusion_boundaries: bool = False):
  """Returns eval_step(params, batch) -> {"loss_sum", "count"} (sum over predicted tokens)."""
  cfg = _model_config(config, fusion_boundaries)
  model = model_lib.Transformer(cfg, deterministic=True)

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["tokens"], batch.get("mask"))
    loss, count = loss_lib.cross_entropy(cfg, logits, batch)
    return {"loss_sum": loss * count, "count": count}

  return eval_step


def make_output_step(config, fusion_boundaries: bool = False):
  """Returns outputs(params, batch) -> the model's output logits in float32 [batch, length, V]:
  f(x; theta), whose change over a step is the update size."""
  cfg = _model_config(config, fusion_boundaries)
  model = model_lib.Transformer(cfg, deterministic=True)

  def outputs(params, batch):
    return model.apply({"params": params}, batch["tokens"], batch.get("mask")).astype(
        jnp.float32)

  return outputs


def update_size(before: jax.Array, after: jax.Array) -> jax.Array:
  """The size of a model update on a fixed batch (Wang et al. 2022, "DeepNet", section 3:
  ||F(x; theta_t+1) - F(x; theta_t)||), per run: the root mean square over the batch's tokens
  of the Euclidean norm of the change of the output logits. `before`, `after`: [K, batch,
  length, V]; returns [K]."""
  squared = jnp.sum(jnp.square(after - before), axis=-1)
  return jnp.sqrt(jnp.mean(squared.reshape(squared.shape[0], -1), axis=1))


def make_locate_step(config, fusion_boundaries: bool = False):
  """Returns locate(state, batch) -> the finiteness flags of every site of the forward pass
  that `state` took on `batch` (normstudy.core.telemetry.site_flags), with the same dropout.

  Called for a step whose loss or gradient was non-finite, on the state after it: a skipped
  step leaves the parameters as they were, so this re-runs exactly that step's forward."""
  cfg = _model_config(config, fusion_boundaries)
  model = _model(cfg, telemetry.Probe(locate=True))

  def locate(state: TrainState, batch):
    # The failed step folded in its own index, one less than the counter after it.
    dropout_rng = dropout_key(state, state.step - 1)
    _, variables = model.apply({"params": state.params}, batch["tokens"], batch.get("mask"),
                               rngs={"dropout": dropout_rng}, mutable=[telemetry.LOCATE])
    return telemetry.site_flags(cfg, variables[telemetry.LOCATE])

  return locate


def make_train_block(config, fusion_boundaries: bool = False):
  """Returns train_block(state, work) -> (state, metrics): the first `work["count"]` steps of
  train_step (make_train_step's, without telemetry) on `work["batches"]` ([L, ...], one batch
  per step) in one compiled loop, so a small model pays one host round trip per block of steps
  rather than per step. Each step is the same computation as train_step's own program, so a
  trajectory stepped in blocks is bit for bit the one stepped one at a time (tested on XLA:CPU:
  tests/test_steps.py).

  metrics: train_step's, each with a leading axis [L] whose entries past `count` are zeros,
  plus "sites": for a step whose update was skipped while the run was running, the
  finiteness flags of every forward site of that step (make_locate_step's, on the state after
  it, which a skipped step leaves with the parameters that failed), otherwise all True.
  `count` is a traced scalar: one compiled block serves every length up to L."""
  # Traced once each: the buffers' shapes come from the trace that the loop's body then inlines
  # (jit's trace cache, keyed on the same abstract arguments; inline=True puts the step's
  # operations in the body as tracing it there would, so the program is the same one).
  train_step = jax.jit(make_train_step(config, False, fusion_boundaries), inline=True)
  locate = make_locate_step(config, fusion_boundaries)

  def train_block(state: TrainState, work):
    batches, count = work["batches"], work["count"]
    length = jax.tree.leaves(batches)[0].shape[0]
    first = jax.tree.map(lambda x: x[0], batches)
    shapes = jax.eval_shape(train_step, state, first)[1]
    site_shapes = jax.eval_shape(locate, state, first)
    buffers = {**jax.tree.map(lambda s: jnp.zeros((length, *s.shape), s.dtype), shapes),
               keys.SITES: jax.tree.map(lambda s: jnp.zeros((length, *s.shape), s.dtype),
                                     site_shapes)}

    def one_step(i, carry):
      state, buffers = carry
      batch = jax.tree.map(lambda x: x[i], batches)
      state, metrics = train_step(state, batch)
      failed = jnp.logical_and(metrics[keys.SKIPPED], metrics[keys.ACTIVE])
      metrics[keys.SITES] = jax.lax.cond(
          failed, lambda: locate(state, batch),
          lambda: jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), site_shapes))
      buffers = jax.tree.map(lambda buf, value: buf.at[i].set(value), buffers, metrics)
      return state, buffers

    return jax.lax.fori_loop(0, count, one_step, (state, buffers))

  return train_block

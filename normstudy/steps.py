"""The train state and the train, eval and locate steps: pure functions of (state, batch).

A run's hyperparameters (peak learning rate, clip norm, weight decay, warm-up, Adam's betas and
eps) and its seed are arrays in the state, and a run decides its own life inside the step
(finished, or halted by its non-finite policy or its loss-scale floor; a stopped run is frozen).
So one compiled step serves K runs stacked on a leading axis (`jax.vmap`, normstudy.train), and a
single run is the case K = 1. Being pure (every random number derived from the state) is what
lets the loop resume bit-exactly.
"""

import functools
import json
from typing import Any

from flax import struct
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from normstudy import loss as loss_lib
from normstudy import model as model_lib
from normstudy import optimizer as optimizer_lib
from normstudy import precision
from normstudy import telemetry

# A run's life, `TrainState.status`.
RUNNING, FINISHED, HALTED_NONFINITE, HALTED_SKIPS, HALTED_SCALE = range(5)
HALT_REASONS = {
    HALTED_NONFINITE: "non-finite gradient with config.train.on_nonfinite=halt",
    HALTED_SKIPS: "too many consecutive skipped updates "
                  "(config.train.max_consecutive_skips)",
    HALTED_SCALE: "fp16 gradients overflowed with the loss scale at its minimum "
                  "(config.optimizer.loss_scale.min_scale)",
}

# Config fields that are data in the state (so they may differ between the runs of one program).
RUN_DATA_FIELDS = tuple(f"optimizer.{name}" for name in optimizer_lib.HYPERPARAMETERS
                        if name != "schedule_steps") + (
                            "optimizer.loss_scale.initial_scale",
                            "optimizer.loss_scale.growth_interval",
                            "optimizer.loss_scale.min_scale", "train.seed", "train.num_steps",
                            "train.count_skipped_steps", "train.on_nonfinite",
                            "train.max_consecutive_skips")


def run_values(config, schedule_steps=None) -> dict:
  """The per-run data of a config as arrays: seed, optimizer hyperparameters, the run's limits
  and its loss-scale settings. Stack K of them to train K runs in one program."""
  train, ls = config.train, config.optimizer.loss_scale
  return {
      "seed": jnp.asarray(train.seed, jnp.int32),
      "hparams": optimizer_lib.hyperparameters(config, schedule_steps),
      "limits": {
          "num_steps": jnp.asarray(train.num_steps, jnp.int32),
          "count_skipped_steps": jnp.asarray(train.count_skipped_steps, bool),
          "halt_on_nonfinite": jnp.asarray(train.on_nonfinite == "halt", bool),
          "max_consecutive_skips": jnp.asarray(train.max_consecutive_skips, jnp.int32),
      },
      "loss_scale": {
          "initial_scale": jnp.asarray(ls.initial_scale, jnp.float32),
          "growth_interval": jnp.asarray(ls.growth_interval, jnp.int32),
          "min_scale": jnp.asarray(ls.min_scale, jnp.float32),
      },
  }


@struct.dataclass
class TrainState:
  step: jax.Array  # int32: train steps taken (batches consumed), skipped ones included
  opt_step: jax.Array  # int32: updates applied; drives the learning-rate schedule
  params: Any
  opt_state: Any
  loss_scale: precision.LossScale
  skipped_total: jax.Array  # int32: updates skipped for non-finite gradients so far
  consecutive_skips: jax.Array  # int32: skipped updates in a row, up to this step
  rng: jax.Array  # dropout key; each step folds in `step`
  hparams: dict  # float32 scalars (normstudy.optimizer.HYPERPARAMETERS)
  limits: dict  # num_steps, count_skipped_steps, halt_on_nonfinite, max_consecutive_skips
  status: jax.Array  # int32: RUNNING, FINISHED or a HALTED_* reason
  halt_step: jax.Array  # int32: the step that halted the run (0 while it has not)


def init_state(config, values: dict, params=None) -> TrainState:
  """A fresh state from a run's (possibly traced) `run_values`. Parameters come from
  PRNGKey(seed) unless given (boxed or not); dropout keys from PRNGKey(seed + 1)."""
  cfg = model_lib.ModelConfig.create(config.model)
  seed, hparams = values["seed"], values["hparams"]
  if params is None:
    params = model_lib.boxed_init(cfg)(jax.random.PRNGKey(seed))
  tx = optimizer_lib.make_optimizer(config.optimizer, hparams, model_lib.decay_mask(cfg))
  zero = jnp.zeros((), jnp.int32)
  dynamic = config.model.dtype == "float16"
  ls = values["loss_scale"]
  return TrainState(
      step=zero, opt_step=zero, params=params, opt_state=tx.init(params),
      loss_scale=precision.LossScale(
          scale=jnp.where(dynamic, ls["initial_scale"], 1.0).astype(jnp.float32),
          good_steps=zero, growth_interval=ls["growth_interval"], min_scale=ls["min_scale"],
          dynamic=dynamic),
      skipped_total=zero, consecutive_skips=zero, rng=jax.random.PRNGKey(seed + 1),
      hparams=hparams, limits=values["limits"], status=zero, halt_step=zero)


def unboxed(tree):
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.Partitioned)
                      else x, tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


@functools.lru_cache(maxsize=16)
def _initializer(frozen_config: str):
  config = ml_collections.ConfigDict(json.loads(frozen_config))
  return jax.jit(lambda values: unboxed(init_state(config, values)))


def create_train_state(config, params=None) -> TrainState:
  """The state of one run, unboxed, from its config (jitted: one compiled initialiser per
  config), or around the given parameters."""
  values = run_values(config)
  if params is not None:
    return unboxed(init_state(config, values, params))
  frozen = json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True)
  return _initializer(frozen)(values)


def _tree_where(condition, new, old):
  return jax.tree.map(lambda n, o: jnp.where(condition, n, o), new, old)


def _model(cfg, probe=telemetry.OFF):
  return model_lib.Transformer(cfg, deterministic=cfg.dropout == 0, probe=probe)


def make_train_step(config, telemetry_on: bool = False):
  """Returns train_step(state, batch) -> (state, metrics) for one run (vmap it for K).

  metrics: loss (cross entropy), grad_norm (unscaled, before clipping), clipped, lr,
  loss_scale (the scale this step's loss was multiplied by), skipped, skipped_total, active
  (the run was running before this step; the others are frozen and report nothing new),
  status, and with `telemetry_on` the per-layer arrays of normstudy.telemetry under "telemetry".
  The state update is the same computation either way.
  """
  cfg = model_lib.ModelConfig.create(config.model)
  mask = model_lib.decay_mask(cfg)
  model = _model(cfg, telemetry.Probe(stats=telemetry_on))
  opt_cfg = config.optimizer
  loss_cfg = config.get("loss")
  float16 = config.model.dtype == "float16"

  def train_step(state: TrainState, batch):
    hp = state.hparams
    tx = optimizer_lib.make_optimizer(opt_cfg, hp, mask)
    dropout_rng = jax.random.fold_in(state.rng, state.step)
    scale = state.loss_scale.scale

    def scaled_loss(params):
      inputs = ({"params": params}, batch["tokens"], batch.get("mask"))
      rngs = {"dropout": dropout_rng}
      sown = {}
      if telemetry_on:
        logits, variables = model.apply(*inputs, rngs=rngs, mutable=[telemetry.STATS])
        sown = variables[telemetry.STATS]
      else:
        logits = model.apply(*inputs, rngs=rngs)
      loss, terms = loss_lib.objective(cfg, loss_cfg, logits, batch)
      observed = jax.lax.stop_gradient((terms, sown, logits if telemetry_on else None))
      # float32/bfloat16 skip the scaling passes (the scale is 1 and static there).
      return (loss * scale if float16 else loss), (loss, observed)

    grads, (loss, (terms, sown, logits)) = jax.grad(scaled_loss, has_aux=True)(state.params)
    if float16:
      grads = jax.tree.map(lambda g: g / scale, grads)
    finite = jnp.logical_and(precision.all_finite(grads), jnp.isfinite(loss))
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    loss_scale, scale_underflow = precision.update(state.loss_scale, finite)

    step = state.step + 1
    opt_step = state.opt_step + finite.astype(jnp.int32)
    consecutive = jnp.where(finite, 0, state.consecutive_skips + 1)
    limits = state.limits
    if float16:  # the loss scaler skips overflowing steps; fairseq stops at its floor
      halt, reason = scale_underflow, HALTED_SCALE
    else:
      halt = jnp.where(limits["halt_on_nonfinite"], ~finite,
                       consecutive > limits["max_consecutive_skips"])
      reason = jnp.where(limits["halt_on_nonfinite"], HALTED_NONFINITE, HALTED_SKIPS)
    done = jnp.where(limits["count_skipped_steps"], step, opt_step) >= limits["num_steps"]
    status = jnp.where(halt, reason, jnp.where(done, FINISHED, RUNNING)).astype(jnp.int32)
    updated = state.replace(
        step=step, opt_step=opt_step,
        params=_tree_where(finite, new_params, state.params),
        opt_state=_tree_where(finite, new_opt_state, state.opt_state),
        loss_scale=loss_scale,
        skipped_total=state.skipped_total + (~finite).astype(jnp.int32),
        consecutive_skips=consecutive.astype(jnp.int32), status=status,
        halt_step=jnp.where(halt, step, 0).astype(jnp.int32))
    active = state.status == RUNNING
    new_state = _tree_where(active, updated, state)  # a stopped run stays as it stopped
    metrics = {
        **terms,
        "grad_norm": grad_norm,
        "clipped": jnp.logical_and(hp["clip_norm"] > 0, grad_norm > hp["clip_norm"]),
        "lr": optimizer_lib.learning_rate(opt_cfg.schedule, hp, state.opt_step),
        "loss_scale": scale,
        "skipped": ~finite,
        "skipped_total": updated.skipped_total,
        "active": active,
        "status": updated.status,
    }
    if telemetry_on:
      metrics["telemetry"] = telemetry.collect(cfg, sown, logits, grads, updates, state.params)
    return new_state, metrics

  return train_step


def make_eval_step(config):
  """Returns eval_step(params, batch) -> {"loss_sum", "count"} (sum over predicted tokens)."""
  cfg = model_lib.ModelConfig.create(config.model)
  model = model_lib.Transformer(cfg, deterministic=True)

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["tokens"], batch.get("mask"))
    loss, count = loss_lib.cross_entropy(cfg, logits, batch)
    return {"loss_sum": loss * count, "count": count}

  return eval_step


def make_locate_step(config):
  """Returns locate(state, batch) -> the finiteness flags of every site of the forward pass
  that `state` took on `batch` (normstudy.telemetry.site_flags), with the same dropout.

  Called for a step whose loss or gradient was non-finite, on the state after it: a skipped
  step leaves the parameters as they were, so this re-runs exactly that step's forward."""
  cfg = model_lib.ModelConfig.create(config.model)
  model = _model(cfg, telemetry.Probe(locate=True))

  def locate(state: TrainState, batch):
    # The failed step folded in its own index, one less than the counter after it.
    dropout_rng = jax.random.fold_in(state.rng, state.step - 1)
    _, variables = model.apply({"params": state.params}, batch["tokens"], batch.get("mask"),
                               rngs={"dropout": dropout_rng}, mutable=[telemetry.LOCATE])
    return telemetry.site_flags(cfg, variables[telemetry.LOCATE])

  return locate

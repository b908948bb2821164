"""The train state, the loss and the train/eval steps: pure functions of (state, batch).

Being pure (no Python side effects, every random number derived from the state) is what lets the
training loop jit the step once, resume it bit-exactly and, later, vmap several runs into one
program.
"""

from typing import Any

from flax import struct
import jax
import jax.numpy as jnp
import optax

from normstudy import model as model_lib
from normstudy import optimizer as optimizer_lib
from normstudy import precision


@struct.dataclass
class TrainState:
  step: jax.Array  # int32: train steps taken (batches consumed), skipped ones included
  opt_step: jax.Array  # int32: updates applied; drives the learning-rate schedule
  params: Any
  opt_state: Any
  loss_scale: precision.LossScale
  skipped_total: jax.Array  # int32: updates skipped for non-finite gradients so far
  rng: jax.Array  # dropout key; each step folds in `step`


def create_train_state(config, params=None) -> TrainState:
  """A fresh state: parameters from `config.train.seed` unless given."""
  if params is None:
    params = model_lib.init_params(config.model, config.train.seed)
  tx = optimizer_lib.make_optimizer(config.optimizer, config.train.num_steps)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      opt_step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      loss_scale=precision.create(config.model.dtype, config.optimizer.loss_scale),
      skipped_total=jnp.zeros((), jnp.int32),
      rng=jax.random.PRNGKey(config.train.seed + 1),
  )


def cross_entropy(cfg: model_lib.ModelConfig, logits, batch) -> tuple[jax.Array, jax.Array]:
  """(mean loss, number of predicted tokens). Causal: next token; encoder: masked positions."""
  tokens = batch["tokens"]
  if cfg.causal:
    logits, targets = logits[:, :-1], tokens[:, 1:]
    weights = jnp.ones(targets.shape, jnp.float32)
  else:
    targets, weights = tokens, batch["mask"].astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  count = jnp.sum(weights)
  return jnp.sum(losses * weights) / jnp.maximum(count, 1.0), count


def _model(cfg, deterministic, telemetry=False):
  return model_lib.Transformer(cfg, deterministic=deterministic, telemetry=telemetry)


TELEMETRY_LAYER_METRICS = ("attn_logit_max", "act_rms", "grad_norm", "update_norm", "param_norm")


def per_layer_norms(cfg: model_lib.ModelConfig, tree) -> jax.Array:
  """[num_layers] L2 norms of each layer's part of a parameter-shaped tree."""
  if cfg.scan_layers:
    squares = [jnp.sum(jnp.square(x.astype(jnp.float32)), axis=tuple(range(1, x.ndim)))
               for x in jax.tree.leaves(tree["layers"])]
    return jnp.sqrt(sum(squares))
  return jnp.stack([optax.tree.norm(tree[f"layer_{i}"]) for i in range(cfg.num_layers)])


def _per_layer_intermediate(cfg, intermediates, path) -> jax.Array:
  """[num_layers] values a Block sowed under `path` (a tuple of module names, then the name)."""
  def lookup(tree):
    for key in path:
      tree = tree[key]
    return tree[0]  # sow appends to a tuple
  if cfg.scan_layers:
    return lookup(intermediates["layers"])
  return jnp.stack([lookup(intermediates[f"layer_{i}"]) for i in range(cfg.num_layers)])


def make_train_step(config, telemetry: bool = False):
  """Returns train_step(state, batch) -> (state, metrics).

  With `telemetry`, metrics also hold per-layer arrays [num_layers] under "telemetry":
  attn_logit_max, act_rms, grad_norm, update_norm, param_norm; and the global output_logit_max
  and log_z_mean. The state update is the same computation either way.
  """
  cfg = model_lib.ModelConfig.create(config.model)
  tx = optimizer_lib.make_optimizer(config.optimizer, config.train.num_steps)
  schedule = optimizer_lib.learning_rate_schedule(config.optimizer, config.train.num_steps)
  clip_norm = config.optimizer.clip_norm or 0.0
  model = _model(cfg, deterministic=cfg.dropout == 0, telemetry=telemetry)

  def train_step(state: TrainState, batch):
    dropout_rng = jax.random.fold_in(state.rng, state.step)
    scale = state.loss_scale.scale

    dynamic = state.loss_scale.dynamic  # static: float32/bfloat16 skip the scaling passes

    def scaled_loss(params):
      inputs = ({"params": params}, batch["tokens"], batch.get("mask"))
      rngs = {"dropout": dropout_rng}
      if telemetry:
        logits, variables = model.apply(*inputs, rngs=rngs, mutable=["intermediates"])
      else:
        logits = model.apply(*inputs, rngs=rngs)
      loss, _ = cross_entropy(cfg, logits, batch)
      observed = {}
      if telemetry:
        observed = jax.lax.stop_gradient({
            "intermediates": variables["intermediates"],
            "output_logit_max": jnp.max(logits),
            "log_z_mean": jnp.mean(jax.nn.logsumexp(logits, axis=-1)),
        })
      return (loss * scale if dynamic else loss), (loss, observed)

    grads, (loss, observed) = jax.grad(scaled_loss, has_aux=True)(state.params)
    if dynamic:
      grads = jax.tree.map(lambda g: g / scale, grads)
    finite = jnp.logical_and(precision.all_finite(grads), jnp.isfinite(loss))
    grad_norm = optax.tree.norm(grads)

    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep_old = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    loss_scale, scale_underflow = precision.update(state.loss_scale, finite)
    skipped = ~finite
    new_state = state.replace(
        step=state.step + 1,
        opt_step=state.opt_step + finite.astype(jnp.int32),
        params=keep_old(new_params, state.params),
        opt_state=keep_old(new_opt_state, state.opt_state),
        loss_scale=loss_scale,
        skipped_total=state.skipped_total + skipped.astype(jnp.int32),
    )
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "clipped": jnp.logical_and(clip_norm > 0, grad_norm > clip_norm),
        "lr": schedule(state.opt_step),
        "loss_scale": scale,  # the scale this step's loss was multiplied by
        "skipped": skipped,
        "skipped_total": new_state.skipped_total,
        "scale_underflow": scale_underflow,
    }
    if telemetry:
      inter = observed["intermediates"]
      metrics["telemetry"] = {
          "attn_logit_max": _per_layer_intermediate(cfg, inter, ("attention", "attn_logit_max")),
          "act_rms": _per_layer_intermediate(cfg, inter, ("act_rms",)),
          "grad_norm": per_layer_norms(cfg, grads),
          "update_norm": per_layer_norms(cfg, updates),
          "param_norm": per_layer_norms(cfg, state.params),
          "output_logit_max": observed["output_logit_max"],
          "log_z_mean": observed["log_z_mean"],
      }
    return new_state, metrics

  return train_step


def make_eval_step(config):
  """Returns eval_step(params, batch) -> {"loss_sum", "count"} (sum over predicted tokens)."""
  cfg = model_lib.ModelConfig.create(config.model)
  model = _model(cfg, deterministic=True)

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["tokens"], batch.get("mask"))
    loss, count = cross_entropy(cfg, logits, batch)
    return {"loss_sum": loss * count, "count": count}

  return eval_step

"""The optax chain built from `config.optimizer`: clip, Adam(W), learning-rate schedule."""

import jax
import optax

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine", "polynomial")


def learning_rate_schedule(opt_cfg, num_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to `learning_rate` over `warmup_steps`, then the named decay to
  `end_learning_rate` at `num_steps` (`constant` stays at the peak). `polynomial` uses power
  `opt_cfg.get("power", 1.0)`: fairseq's polynomial_decay default of 1 is a linear decay."""
  peak, end = opt_cfg.learning_rate, opt_cfg.end_learning_rate
  warmup = int(opt_cfg.warmup_steps)
  decay_steps = max(int(num_steps) - warmup, 1)
  if opt_cfg.schedule == "constant":
    decay = optax.constant_schedule(peak)
  elif opt_cfg.schedule == "linear":
    decay = optax.linear_schedule(peak, end, decay_steps)
  elif opt_cfg.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak if peak else 0.0)
  elif opt_cfg.schedule == "polynomial":
    decay = optax.polynomial_schedule(peak, end, opt_cfg.get("power", 1.0), decay_steps)
  else:
    raise ValueError(
        f"unknown schedule {opt_cfg.schedule!r}; allowed: {', '.join(SCHEDULES)}")
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _decay_mask(params):
  """Weight decay on weight matrices and embeddings; never on norm gains and biases."""
  def decays(path, _):
    return not any("norm" in str(getattr(key, "key", key)) for key in path)
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(opt_cfg, num_steps: int) -> optax.GradientTransformation:
  """clip_by_global_norm (if clip_norm) -> Adam -> weight decay -> learning rate.

  `adamw` decays decoupled from the gradient statistics (as fairseq's `adam` does); `adam` adds
  the L2 term to the gradient before Adam. Clipping sees the unscaled gradient, once per step.
  """
  if opt_cfg.name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {opt_cfg.name!r}; allowed: {', '.join(OPTIMIZERS)}")
  schedule = learning_rate_schedule(opt_cfg, num_steps)
  chain = []
  if opt_cfg.clip_norm:
    chain.append(optax.clip_by_global_norm(opt_cfg.clip_norm))
  decay = ([optax.add_decayed_weights(opt_cfg.weight_decay, _decay_mask)]
           if opt_cfg.weight_decay else [])
  adam = optax.scale_by_adam(b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps)
  chain += decay + [adam] if opt_cfg.name == "adam" else [adam] + decay
  chain.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*chain)

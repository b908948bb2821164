"""The optimizer: clip, Adam (four flavours), weight decay and the learning-rate schedule.

Hyperparameters are data: normstudy.core.per_run turns the numeric ones into float32 arrays that
live in the train state, and `make_optimizer` builds the optax chain from them inside the
jitted step. A sweep then stacks K runs' hyperparameters and vmaps one compiled step; a single
run is the K = 1 case. What changes the program's structure (the optimizer's name, the schedule's
shape) stays in the config.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from normstudy.core.registry import Registry

# name -> decayed(peak, end, progress in [0, 1], power): the rate after the warm-up.
SCHEDULES: Registry = Registry("optimizer.schedule")
SCHEDULES.register("constant", lambda peak, end, progress, power: peak)
SCHEDULES.register("linear", lambda peak, end, progress, power: peak + (end - peak) * progress)
SCHEDULES.register(  # fairseq's polynomial_decay
    "polynomial", lambda peak, end, progress, power: (peak - end) * (1.0 - progress)**power + end)
SCHEDULES.register(  # optax's cosine_decay_schedule
    "cosine", lambda peak, end, progress, power: end + (peak - end) * 0.5 * (
        1.0 + jnp.cos(jnp.pi * progress)))


def learning_rate(schedule: str, hp: dict, count) -> jax.Array:
  """The learning rate of update `count` (0-based): linear warm-up from 0 to `learning_rate`
  over `warmup_steps`, then the named decay to `end_learning_rate` at `schedule_steps`
  (`constant` stays at the peak). `polynomial` is fairseq's polynomial_decay
  ((peak - end) (1 - t)^power + end); `cosine` is optax's cosine_decay_schedule; `linear` is
  polynomial with power 1. The same values as optax's schedules joined after the warm-up."""
  count = jnp.asarray(count, jnp.float32)
  peak, end, warmup = hp["learning_rate"], hp["end_learning_rate"], hp["warmup_steps"]
  progress = jnp.clip((count - warmup) / jnp.maximum(hp["schedule_steps"] - warmup, 1.0), 0, 1)
  decayed = SCHEDULES.get(schedule)(peak, end, progress, hp["power"])
  warming = peak * count / jnp.maximum(warmup, 1.0)
  return jnp.where(count < warmup, warming, decayed)


def _scale_by_moments(b1, b2, direction) -> optax.GradientTransformation:
  """optax's Adam moments (`mu`, `nu`, `count`; the state optax's scale_by_adam keeps) with the
  direction `direction(m, v, t)` of each leaf's moments after update t (1-based, float32)."""

  def init_fn(params):
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=optax.tree.zeros_like(params),
                                  nu=optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    return (jax.tree.map(lambda m, v: direction(m, v, t), mu, nu),
            optax.ScaleByAdamState(count=count, mu=mu, nu=nu))

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_fairseq_adam(b1, b2, eps) -> optax.GradientTransformation:
  """fairseq's Adam direction (fairseq/optim/adam.py): `sqrt(1 - b2^t) / (1 - b1^t) * m /
  (sqrt(v) + eps)` with eps added to the square root of the bias-uncorrected v. optax's
  `scale_by_adam` adds eps after the correction instead; the moments are optax's own."""
  return _scale_by_moments(b1, b2, lambda m, v, t: (
      jnp.sqrt(1.0 - b2**t) / (1.0 - b1**t)) * m / (jnp.sqrt(v) + eps))


# Adam-atan2's constants: a = 4/pi (1.27, the reference implementations' value) makes the step
# of a consistent gradient, m_hat = sqrt(v_hat), Adam's 1; b = 1.
ATAN2_A, ATAN2_B = 4 / jnp.pi, 1.0


def scale_by_adam_atan2(b1, b2) -> optax.GradientTransformation:
  """Adam-atan2's direction (Everett et al. 2024, "Scaling Exponents Across Parameterizations
  and Optimizers", section 4.3): a * atan2(m_hat, b * sqrt(v_hat)) with optax's moments and
  bias corrections, in place of m_hat / (sqrt(v_hat) + eps): no epsilon, and the direction is
  the same for a gradient scaled by any positive factor."""
  return _scale_by_moments(b1, b2, lambda m, v, t: ATAN2_A * jnp.arctan2(
      m / (1.0 - b1**t), ATAN2_B * jnp.sqrt(v / (1.0 - b2**t))))


# Each flavour puts `pre` right before its Adam direction and `post` right after it (a
# parametrization's per-parameter epsilon and rate; empty lists otherwise), so decoupled decay
# keeps lr x weight_decay for every parameter.
def _adam_atan2(hp, mask, pre, post):
  return [*pre, scale_by_adam_atan2(hp["b1"], hp["b2"]), *post,
          optax.add_decayed_weights(hp["weight_decay"], mask)]


def _adamw(hp, mask, pre, post):
  return [*pre, optax.scale_by_adam(b1=hp["b1"], b2=hp["b2"], eps=hp["eps"]), *post,
          optax.add_decayed_weights(hp["weight_decay"], mask)]


def _adam(hp, mask, pre, post):
  return [optax.add_decayed_weights(hp["weight_decay"], mask),
          *pre, optax.scale_by_adam(b1=hp["b1"], b2=hp["b2"], eps=hp["eps"]), *post]


def _adam_fairseq(hp, mask, pre, post):
  del mask  # fairseq decays every parameter, norm gains and biases included
  return [*pre, scale_by_fairseq_adam(hp["b1"], hp["b2"], hp["eps"]), *post,
          optax.add_decayed_weights(hp["weight_decay"])]


def scale_leaves(factors) -> optax.GradientTransformation:
  """Each leaf's update times its constant in `factors` (a tree of floats shaped like the
  parameters). Stateless."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, f: u if f == 1.0 else u * jnp.asarray(f, u.dtype), updates,
                        factors), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


# name -> (hyperparameters, decay mask, pre, post) -> the optax transforms between clipping and
# the rate.
OPTIMIZERS: Registry = Registry("optimizer.name")
OPTIMIZERS.register("adamw", _adamw)  # decay decoupled from the gradient statistics
OPTIMIZERS.register("adam", _adam)  # L2 added to the gradient before Adam
OPTIMIZERS.register("adam_fairseq", _adam_fairseq)
OPTIMIZERS.register("adam_atan2", _adam_atan2)  # no epsilon (Everett et al. 2024); decay as adamw


def clip_update_rms(threshold: float) -> optax.GradientTransformation:
  """Update clipping (Shazeer & Stern 2018, Adafactor, section 5; Levanter's
  `update_rms_clipping`, StableAdamW's per-tensor form): each parameter's update divided by
  max(1, RMS(update) / threshold), so no tensor's update has an RMS above `threshold`.
  Stateless."""

  def update_fn(updates, state, params=None):
    del params

    def clipped(u):
      rms = jnp.sqrt(jnp.mean(jnp.square(u.astype(jnp.float32))))
      return (u / jnp.maximum(1.0, rms / threshold)).astype(u.dtype)
    return jax.tree.map(clipped, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


class SkipSpikesState(NamedTuple):
  inner: Any  # the wrapped optimizer's state, kept as it was by a skipped step
  losses: jax.Array  # [window + 1] float32: a ring of the newest losses
  grad_norms: jax.Array  # [window + 1] float32: the same for the gradient norms
  count: jax.Array  # int32: values recorded so far
  skips: jax.Array  # int32: updates skipped as spikes so far


def skip_spikes(inner: optax.GradientTransformation, sigma: float,
                window: int = 128) -> optax.GradientTransformationExtraArgs:
  """Skip-step on spikes (OLMo-core's SkipStepOptimizer.get_step_factor): the step's loss and
  gradient norm join rings of the newest `window` + 1 values; once at least max(20, window / 2)
  are recorded, the update is zeroed and `inner`'s state kept when |x - mean| / std of the
  previous values (std with n - 1) exceeds `sigma` for either. update(..., loss=, grad_norm=)."""
  size = window + 1
  least = max(20, window // 2)

  def init_fn(params):
    zeros = jnp.zeros(size, jnp.float32)
    return SkipSpikesState(inner.init(params), zeros, zeros, jnp.zeros([], jnp.int32),
                           jnp.zeros([], jnp.int32))

  def z_score(ring, at, seen):
    slots = jnp.arange(size)
    before = (slots != at) & (slots < seen)
    n = jnp.sum(before)
    mean = jnp.sum(jnp.where(before, ring, 0.0)) / n
    var = jnp.sum(jnp.where(before, jnp.square(ring - mean), 0.0)) / (n - 1)
    return jnp.abs(ring[at] - mean) / jnp.sqrt(var)

  def update_fn(updates, state, params=None, *, loss, grad_norm, **extra):
    del extra
    at = state.count % size
    losses = state.losses.at[at].set(jnp.asarray(loss, jnp.float32))
    grad_norms = state.grad_norms.at[at].set(jnp.asarray(grad_norm, jnp.float32))
    count = state.count + 1
    seen = jnp.minimum(count, size)
    # NaN scores (a constant history) compare False and skip, as in OLMo-core's torch code.
    take = (seen < least) | ((z_score(losses, at, seen) <= sigma)
                             & (z_score(grad_norms, at, seen) <= sigma))
    inner_updates, inner_state = inner.update(updates, state.inner, params)
    updates = jax.tree.map(lambda u: jnp.where(take, u, jnp.zeros_like(u)), inner_updates)
    kept = jax.tree.map(lambda new, old: jnp.where(take, new, old), inner_state, state.inner)
    return updates, SkipSpikesState(kept, losses, grad_norms, count,
                                    state.skips + (~take).astype(jnp.int32))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def make_optimizer(opt_cfg, hp: dict, decay_mask, lr_multipliers=None,
                   eps_multipliers=None) -> optax.GradientTransformation:
  """clip_by_global_norm -> Adam flavour with weight decay -> update clipping (when
  `update_clip` > 0) -> -learning rate (schedule); all of it inside skip_spikes when
  `skip_spikes` > 0 (whose update then takes loss= and grad_norm=).

  Clipping sees the unscaled gradient once per step; `clip_norm` 0 leaves it untouched (the
  clip's threshold is then infinite, so the chain's structure is the same for every run).
  `decay_mask` (normstudy.core.model.decay_mask) says which parameters weight decay applies to.
  `lr_multipliers`, `eps_multipliers` (normstudy.core.model.optimizer_multipliers; None: all 1):
  a parametrization's per-parameter factors on Adam's direction (the decay keeps its own rate:
  normstudy.core.parametrizations) and on its epsilon (written as the gradient divided by the
  factor before Adam: m / (sqrt(v) + c eps) = (m / c) / (sqrt(v / c^2) + eps)).
  Works with traced `hp`: build it inside the step. Its state does not depend on `hp`.
  """
  clip = jnp.where(hp["clip_norm"] > 0, hp["clip_norm"], jnp.inf)
  # Update clipping, when on, caps the optimizer's update (direction and decay) before the rate.
  update_clip = [clip_update_rms(opt_cfg.update_clip)] if opt_cfg.update_clip > 0 else []
  chain = optax.chain(
      optax.clip_by_global_norm(clip),
      *OPTIMIZERS.get(opt_cfg.name)(
          hp, decay_mask,
          [] if eps_multipliers is None else [scale_leaves(jax.tree.map(
              lambda c: 1.0 / c, eps_multipliers))],
          [] if lr_multipliers is None else [scale_leaves(lr_multipliers)]),
      *update_clip,
      optax.scale_by_schedule(lambda count: -learning_rate(opt_cfg.schedule, hp, count)),
  )
  if opt_cfg.skip_spikes > 0:  # its update then takes loss= and grad_norm=
    return skip_spikes(chain, opt_cfg.skip_spikes, opt_cfg.skip_spikes_window)
  return chain

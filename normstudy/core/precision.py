"""Dynamic loss scaling for float16 training, as fairseq does it, written as pure functions.

The loss is multiplied by `scale` before differentiation and the gradients divided by it after.
A step with any non-finite gradient is skipped and halves the scale (not below `min_scale`);
`growth_interval` consecutive finite steps double it. bfloat16 and float32 need no scaling: their
scale stays 1. The window and the floor are arrays, so runs of one program may differ in them.
"""

from flax import struct
import jax
import jax.numpy as jnp


@struct.dataclass
class LossScale:
  scale: jax.Array  # float32 scalar
  good_steps: jax.Array  # int32: consecutive finite steps since the last change
  growth_interval: jax.Array  # int32
  min_scale: jax.Array  # float32
  dynamic: bool = struct.field(pytree_node=False, default=False)


def all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.stack(leaves).all() if leaves else jnp.asarray(True)


def update(ls: LossScale, finite: jax.Array) -> tuple[LossScale, jax.Array]:
  """The scale after a step whose gradients were `finite`.

  Returns (new state, underflow): underflow is True when a halving would have gone below
  `min_scale` (fairseq stops the run there; the caller decides).
  """
  if not ls.dynamic:
    return ls, jnp.asarray(False)
  halved = ls.scale / 2
  underflow = jnp.logical_and(~finite, halved < ls.min_scale)
  good = jnp.where(finite, ls.good_steps + 1, 0)
  grow = good >= ls.growth_interval
  scale = jnp.where(finite, jnp.where(grow, ls.scale * 2, ls.scale),
                    jnp.maximum(halved, ls.min_scale))
  good = jnp.where(grow, 0, good)
  return ls.replace(scale=scale, good_steps=good.astype(jnp.int32)), underflow

"""layers.fusion_boundary and platform.CPU_COMPILER_OPTIONS: the boundary is the identity forward
and backward, and with the options XLA:CPU keeps it (jaxlib would otherwise drop it before
fusion, silently undoing the speed-up benchmarks/profile.py measured)."""

import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import layers
from normstudy.engine import platform


def _loss(x, w, boundary):
  h = x @ w
  h = layers.fusion_boundary(h) if boundary else h
  return jnp.sum(jnp.tanh(h) ** 2)


def test_the_boundary_changes_no_value_or_gradient():
  rng = np.random.default_rng(0)
  x, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((8, 16), (16, 4)))
  np.testing.assert_array_equal(layers.fusion_boundary(x), x)
  with_boundary = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)), static_argnums=2,
                          compiler_options=platform.CPU_COMPILER_OPTIONS)
  plain = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)), static_argnums=2,
                  compiler_options=platform.CPU_COMPILER_OPTIONS)
  (a, (ga, gwa)), (b, (gb, gwb)) = with_boundary(x, w, True), plain(x, w, False)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gwa, gwb, rtol=1e-5, atol=1e-6)


def test_the_cpu_options_keep_the_barriers_through_compilation():
  x = jnp.ones((8, 16), jnp.float32)
  w = jnp.ones((16, 4), jnp.float32)
  grad = jax.grad(_loss, argnums=1)
  kept = jax.jit(grad, static_argnums=2, compiler_options=platform.CPU_COMPILER_OPTIONS)
  dropped = jax.jit(grad, static_argnums=2)
  assert "opt-barrier" in kept.lower(x, w, True).compile().as_text()
  assert "opt-barrier" not in dropped.lower(x, w, True).compile().as_text()

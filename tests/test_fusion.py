"""layers.fusion_boundary and platform.CPU_COMPILER_OPTIONS: the boundary is the identity forward
and backward, and with the options XLA:CPU keeps it (jaxlib would otherwise drop it before
fusion, silently undoing the speed-up `benchmarks/throughput.py profile` measured);
layers.widening_product is the plain product, value and gradients bit for bit, with the smaller
operand transposed."""

import re
import types

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


def _widening_loss(x, w, c, widening):
  cfg = types.SimpleNamespace(fusion_boundaries=True)
  y = layers.widening_product(cfg, x, w) if widening else jnp.einsum("bld,df->blf", x, w)
  return jnp.sum(jnp.tanh(layers.fusion_boundary(y)) * c)


def _widening_gradients(widening):
  return jax.jit(jax.value_and_grad(_widening_loss, argnums=(0, 1)), static_argnums=3,
                 compiler_options=platform.CPU_COMPILER_OPTIONS)


def test_the_widening_product_has_the_plain_products_value_and_gradients_bit_for_bit():
  rng = np.random.default_rng(1)
  x, w, c = (rng.normal(size=s).astype(np.float32) for s in ((4, 32, 16), (16, 64), (4, 32, 64)))
  loss, (dx, dw) = _widening_gradients(True)(x, w, c, True)
  plain_loss, (plain_dx, plain_dw) = _widening_gradients(False)(x, w, c, False)
  np.testing.assert_array_equal(loss, plain_loss)
  np.testing.assert_array_equal(dx, plain_dx)
  np.testing.assert_array_equal(dw, plain_dw)
  # And both are the chain rule, in float64: g = (1 - tanh(y)^2) c, dx = g w^T, dw = x^T g.
  y = np.einsum("bld,df->blf", x.astype(np.float64), w.astype(np.float64))
  g = (1 - np.tanh(y) ** 2) * c
  np.testing.assert_allclose(loss, np.sum(np.tanh(y) * c), rtol=1e-5)
  np.testing.assert_allclose(dx, np.einsum("blf,df->bld", g, w), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(dw, np.einsum("bld,blf->df", x, g), rtol=1e-4, atol=1e-5)


def test_the_widening_products_weight_gradient_transposes_the_smaller_operand():
  # What it is for: XLA:CPU transposes x [tokens, d] for the weight gradient, not the gradient
  # of the output [tokens, f], 4x larger here (`throughput.py profile`: the copies it saves).
  x, w, c = np.ones((4, 32, 16), np.float32), np.ones((16, 64), np.float32), np.ones((4, 32, 64),
                                                                                    np.float32)
  def transposed_copies(widening):
    text = _widening_gradients(widening).lower(x, w, c, widening).compile().as_text()
    return set(re.findall(r"= f32\[(\d+,\d+)\]\{1,0\} (?:fusion|copy|transpose)\(", text))
  assert "64,128" in transposed_copies(False)  # plainly: the output's gradient, [f, tokens]
  assert "64,128" not in transposed_copies(True) and "16,128" in transposed_copies(True)

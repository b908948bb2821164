"""model.remat: rematerialising each block changes no value or gradient (the backward pass
recomputes what it did not keep), lowers what the compiled step keeps, and leaves telemetry and
the locate probe working."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy.core import model as model_lib
from normstudy.core import steps as steps_lib
import inprocess


def _config(make_config, remat, scan):
  config = make_config(num_layers=3, scan_layers=scan, max_len=128, d_model=32, d_ff=64)
  config.model.remat = remat
  config.train.batch_size = 8
  return config


def _value_and_grad(config):
  cfg = model_lib.ModelConfig.create(config.model)
  params = model_lib.init_params(cfg, 0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (8, cfg.max_len)),
                       jnp.int32)

  def loss(p):
    return jnp.mean(model_lib.Transformer(cfg).apply({"params": p}, tokens) ** 2)

  step = jax.jit(jax.value_and_grad(loss))
  return step(params), step.lower(params).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_remat_changes_no_value_or_gradient(make_config, scan):
  (loss, grads), kept = _value_and_grad(_config(make_config, "none", scan))
  for remat in ("block", "dots"):
    (loss_r, grads_r), kept_r = _value_and_grad(_config(make_config, remat, scan))
    np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    if scan:  # XLA:CPU's scheduler is not memory-aware across an unrolled stack; a loop bounds it
      assert kept_r < 0.6 * kept, (remat, kept_r, kept)


@pytest.mark.slow
def test_telemetry_and_the_locator_work_under_remat(make_config):
  for scan in (False, True):
    config = _config(make_config, "block", scan)
    state = inprocess.create_train_state(config)
    batch = {"tokens": jnp.zeros((8, 128), jnp.int32)}
    _, metrics = jax.jit(steps_lib.make_train_step(config, telemetry_on=True))(state, batch)
    assert np.asarray(metrics["telemetry"]["attn_logit_max"]).shape[0] == 3
    flags = jax.jit(steps_lib.make_locate_step(config))(state, batch)
    assert np.asarray(flags["layers"]["resid_mlp"]).shape == (3,)

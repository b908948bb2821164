"""The transformer and its norm-placement factory, checked against independent computations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy import model as model_lib
from normstudy import placements
from normstudy import steps as steps_lib
import numpy_reference as ref

# One row per registered placement: (name, stack ends with a final norm, residual alpha for N).
PLACEMENT_TABLE = [
    ("pre_ln", True, lambda n: 1.0),
    ("post_ln", False, lambda n: 1.0),
    ("deepnorm", False, lambda n: (2 * n) ** 0.25),
    ("sandwich_ln", True, lambda n: 1.0),
]


def test_table_covers_every_registered_placement():
  assert sorted(row[0] for row in PLACEMENT_TABLE) == sorted(placements.names())


@pytest.mark.parametrize("name,final_norm,alpha", PLACEMENT_TABLE)
def test_placement_definition(name, final_norm, alpha):
  placement = placements.get(name)
  assert placement.final_norm == final_norm
  assert placement.residual_alpha(6, False) == pytest.approx(alpha(6))


@pytest.mark.parametrize("name", [row[0] for row in PLACEMENT_TABLE])
def test_every_placement_trains(make_config, name):
  config = make_config(placement=name)
  config.train.num_steps = 25
  state = steps_lib.create_train_state(config)
  step = jax.jit(steps_lib.make_train_step(config))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 16), 0, 32)
  batch = {"tokens": tokens}
  logits = model_lib.forward(config.model, state.params, tokens)
  assert logits.shape == (4, 16, 32) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  losses = []
  for _ in range(25):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert np.isfinite(losses).all()
  assert losses[-1] < losses[0] - 0.5, losses


def test_final_norm_params_follow_placement(make_config):
  for name, final_norm, _ in PLACEMENT_TABLE:
    params = model_lib.init_params(make_config(placement=name).model, 0)
    assert ("final_norm" in params) == final_norm, name


def test_unknown_placement_names_value_and_choices(make_config):
  with pytest.raises(ValueError) as e:
    model_lib.init_params(make_config(placement="peri_norm").model, 0)
  message = str(e.value)
  assert "'peri_norm'" in message
  for name in placements.names():
    assert name in message


def _change_position_9(config):
  """(params, tokens, changed tokens, per-position max |logit change|) for a change at 9."""
  params = model_lib.init_params(config.model, 0)
  tokens = np.arange(16, dtype=np.int32)[None] % 32
  changed = tokens.copy()
  changed[0, 9] = (changed[0, 9] + 5) % 32
  diff = np.abs(np.asarray(model_lib.forward(config.model, params, tokens)
                           - model_lib.forward(config.model, params, changed))).max(-1)[0]
  return params, tokens, changed, diff


@pytest.mark.parametrize("scan", [True, False])
def test_causal_model_does_not_see_the_future(make_config, scan):
  _, _, _, diff = _change_position_9(make_config(causal=True, scan_layers=scan))
  assert (diff[:9] == 0).all()
  assert (diff[9:] > 1e-6).all()


def test_encoder_is_bidirectional_and_masks_inputs(make_config):
  config = make_config(causal=False)
  params, tokens, changed, diff = _change_position_9(config)
  assert (diff > 1e-6).all()  # every position, before and after, sees position 9
  mask = np.zeros((1, 16), bool)
  mask[0, 9] = True
  # A masked position's input is the mask embedding, whatever token stood there.
  masked_a = model_lib.forward(config.model, params, tokens, mask)
  masked_b = model_lib.forward(config.model, params, changed, mask)
  np.testing.assert_array_equal(np.asarray(masked_a), np.asarray(masked_b))


def test_scan_and_loop_stacks_agree(make_config):
  scanned = make_config(scan_layers=True)
  looped = make_config(scan_layers=False)
  params = model_lib.init_params(scanned.model, 0)
  unstacked = {k: v for k, v in params.items() if k != "layers"}
  for i in range(2):
    unstacked[f"layer_{i}"] = jax.tree.map(lambda a: a[i], params["layers"])
  tokens = np.arange(32, dtype=np.int32).reshape(2, 16) % 32
  np.testing.assert_allclose(
      np.asarray(model_lib.forward(scanned.model, params, tokens)),
      np.asarray(model_lib.forward(looped.model, unstacked, tokens)), atol=1e-5)


def _randomized(params, seed):
  """Parameters with every entry random, so norm gains and biases matter too."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
      leaf + 0.3 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)])


def _block(config, params, x):
  cfg = model_lib.ModelConfig.create(config.model)
  return np.asarray(model_lib.Block(cfg).apply({"params": params}, jnp.asarray(x)))


def _block_params(config, x, seed=0):
  cfg = model_lib.ModelConfig.create(config.model)
  params = model_lib.Block(cfg).init(jax.random.PRNGKey(seed), jnp.asarray(x))["params"]
  return _randomized(jax.tree.map(np.asarray, nn.unbox(params)), seed + 1)


def test_deepnorm_block_matches_hand_computation(make_config):
  num_layers = 6
  config = make_config(placement="deepnorm", num_layers=num_layers, causal=True)
  x = np.random.default_rng(0).normal(size=(2, 16, 32)).astype(np.float32)
  params = jax.tree.map(np.asarray, _block_params(config, x))
  alpha = (2 * num_layers) ** 0.25
  eps = config.model.norm_eps
  an, mn = params["attention_norm"], params["mlp_norm"]
  h = ref.layernorm(alpha * x + ref.attention(x, params["attention"], causal=True),
                    an["scale"], an["bias"], eps)
  expected = ref.layernorm(alpha * h + ref.mlp(h, params["mlp"]), mn["scale"], mn["bias"], eps)
  np.testing.assert_allclose(_block(config, params, x), expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name", ["pre_ln", "sandwich_ln"])
def test_residual_placements_match_hand_computation(make_config, name):
  config = make_config(placement=name, causal=True)
  x = np.random.default_rng(1).normal(size=(2, 16, 32)).astype(np.float32)
  params = jax.tree.map(np.asarray, _block_params(config, x, seed=3))
  eps = config.model.norm_eps

  def norm(key, h):
    return ref.layernorm(h, params[key]["scale"], params[key]["bias"], eps)

  if name == "pre_ln":
    h = x + ref.attention(norm("attention_norm", x), params["attention"], True)
    expected = h + ref.mlp(norm("mlp_norm", h), params["mlp"])
  else:
    h = x + norm("attention_out_norm",
                 ref.attention(norm("attention_norm", x), params["attention"], True))
    expected = h + norm("mlp_out_norm", ref.mlp(norm("mlp_norm", h), params["mlp"]))
  np.testing.assert_allclose(_block(config, params, x), expected, atol=2e-4, rtol=2e-4)


def test_deepnorm_beta_scales_branch_init():
  num_layers, d, ff, heads = 3, 256, 1024, 4
  cfg = model_lib.ModelConfig(num_layers=num_layers, d_model=d, num_heads=heads, d_ff=ff,
                              vocab_size=64, max_len=8, placement="deepnorm")
  params = model_lib.init_params(cfg, 0)["layers"]
  beta = (8 * num_layers) ** -0.25
  xavier = lambda fan_in, fan_out: np.sqrt(2.0 / (fan_in + fan_out))
  expected = {
      ("attention", "query"): xavier(d, d),
      ("attention", "key"): xavier(d, d),
      ("attention", "value"): beta * xavier(d, d),
      ("attention", "out"): beta * xavier(d, d),
      ("mlp", "fc1"): beta * xavier(d, ff),
      ("mlp", "fc2"): beta * xavier(ff, d),
  }
  for (module, name), std in expected.items():
    weights = np.asarray(params[module][name])
    assert weights.std() == pytest.approx(std, rel=0.03), (module, name)
    assert abs(weights.mean()) < 0.05 * std


@pytest.mark.parametrize("name", ["post_ln", "deepnorm"])
def test_post_ln_block_outputs_are_normalised(make_config, name):
  config = make_config(placement=name)
  x = 5.0 * np.random.default_rng(2).normal(size=(2, 16, 32)).astype(np.float32) + 3.0
  cfg = model_lib.ModelConfig.create(config.model)
  block = model_lib.Block(cfg)
  params = block.init(jax.random.PRNGKey(0), jnp.asarray(x))["params"]
  y = np.asarray(block.apply({"params": params}, jnp.asarray(x)))
  np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-4)
  np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-3)


def test_attention_relax_equals_plain_attention_in_float32(make_config):
  plain = make_config(attention_relax=0.0, causal=True)
  relaxed = make_config(attention_relax=32.0, causal=True)
  params = model_lib.init_params(plain.model, 0)
  tokens = np.random.default_rng(3).integers(0, 32, (2, 16)).astype(np.int32)
  np.testing.assert_allclose(
      np.asarray(model_lib.forward(relaxed.model, params, tokens)),
      np.asarray(model_lib.forward(plain.model, params, tokens)), atol=1e-5, rtol=1e-5)


def test_attention_relax_stays_finite_where_float16_attention_overflows(make_config):
  plain = make_config(attention_relax=0.0, dtype="float16", causal=False)
  relaxed = make_config(attention_relax=32.0, dtype="float16", causal=False)
  params = model_lib.init_params(plain.model, 0)
  tokens = np.random.default_rng(4).integers(0, 32, (2, 16)).astype(np.int32)
  factor = 1.0
  while factor < 1e6:
    factor *= 2
    grown = jax.tree_util.tree_map_with_path(
        lambda path, a: a * factor if str(path[-1].key) in ("query", "key") else a, params)
    if not np.isfinite(np.asarray(model_lib.forward(plain.model, grown, tokens))).all():
      break
  else:
    pytest.fail("plain float16 attention never overflowed")
  relaxed_logits = np.asarray(model_lib.forward(relaxed.model, grown, tokens))
  assert np.isfinite(relaxed_logits).all(), f"relaxed attention overflowed at factor {factor}"
  # And relax computes the same function: against float32 plain attention on the same weights.
  reference = make_config(attention_relax=0.0, dtype="float32", causal=False)
  expected = np.asarray(model_lib.forward(reference.model, grown, tokens))
  assert np.abs(relaxed_logits - expected).max() < 0.05 * np.abs(expected).max() + 0.05


def test_notebook_api_accepts_plain_dict():
  cfg = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, vocab_size=11, max_len=8)
  params = model_lib.init_params(cfg, seed=7)
  assert isinstance(params, dict)
  leaves = jax.tree.leaves(params)
  assert all(leaf.dtype == jnp.float32 for leaf in leaves)
  logits = model_lib.forward(cfg, params, np.zeros((3, 8), np.int32))
  assert logits.shape == (3, 8, 11) and logits.dtype == jnp.float32
  again = model_lib.init_params(cfg, seed=7)
  for a, b in zip(leaves, jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

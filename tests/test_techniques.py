"""The stability techniques, each against a numpy transcription of its paper's formula, each off
giving the plain model bit for bit, each in the parameter count and the decay mask as it should.

The placements among them (sub_ln, peri_ln, mix_ln, rezero) are also checked block by block in
test_model.py through numpy_reference.BLOCKS; here are what a block test cannot see.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy import errors
from normstudy.core import config as config_lib
from normstudy.core import labels
from normstudy.core import layers
from normstudy.core import loss as loss_lib
from normstudy.core import model as model_lib
from normstudy.core import placements
from normstudy.core import steps as steps_lib
from normstudy.experiments import validation
import inprocess
from conftest import train_losses
import numpy_reference as ref

# option field -> (off value, an on value)


OPTIONS = {
    "qk_norm": ("none", "layernorm"),
    "layer_scale": (0.0, 0.1),
    "emb_grad_shrink": (1.0, 0.1),
    "attn_softcap": (0.0, 5.0),
    "output_softcap": (0.0, 3.0),
    "attention_scores_dtype": ("compute", "float32"),
}


def _randomized(params, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: (np.asarray(leaf) + 0.3 * rng.normal(size=leaf.shape)).astype(
      np.float32), params)


def _block(cfg, x, seed=0, index=0):
  init = jax.jit(lambda key: nn.unbox(layers.Block(cfg).init(key, x)["params"]))
  params = jax.tree.map(np.asarray, _randomized(init(jax.random.key(seed)), seed + 1))
  got = jax.jit(layers.Block(cfg).apply)({"params": params}, x, jnp.int32(index))
  return params, np.asarray(got)


def _x(shape=(2, 16, 32), scale=1.0):
  return (scale * np.random.default_rng(0).normal(size=shape)).astype(np.float32)


def _loss_and_grads(config, params, batch):
  cfg = model_lib.ModelConfig.create(config.model)

  def loss(p):
    logits = model_lib.Transformer(cfg).apply({"params": p}, batch["tokens"], batch.get("mask"))
    return loss_lib.objective(cfg, config.loss, logits, batch)[0]
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_qk_norm_block_matches_numpy(make_config, norm):
  cfg = model_lib.ModelConfig.create(make_config(qk_norm=norm).model)
  x = _x()
  params, got = _block(cfg, x)
  assert params["attention"]["query_norm"]["scale"].shape == (cfg.head_dim,)
  h = x + ref.attention(ref._norm(params, "attention_norm", x, cfg.norm_eps),
                        params["attention"], True, qk_norm=norm, eps=cfg.norm_eps)
  expected = h + ref.mlp(ref._norm(params, "mlp_norm", h, cfg.norm_eps), params["mlp"], "gelu")
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)


def test_qk_norm_bounds_the_attention_logits_that_grow_without_it(make_config):
  # Large q/k weights: plain scores grow with the weights' scale, normalised ones cannot pass
  # sqrt(head_dim) * |gain|^2.
  logits = {}
  for qk_norm in ("none", "layernorm"):
    cfg = model_lib.ModelConfig.create(make_config(qk_norm=qk_norm).model)
    x = _x()
    init = jax.jit(lambda key, cfg=cfg: nn.unbox(layers.Block(cfg).init(key, x)["params"]))
    params = jax.tree.map(np.asarray, init(jax.random.key(0)))
    for name in ("query", "key"):
      params["attention"][name] = params["attention"][name] * 30
    attention = layers.Attention(cfg, 1.0, probe=model_lib.telemetry.Probe(stats=True))
    _, sown = attention.apply({"params": params["attention"]}, x,
                              mutable=[model_lib.telemetry.STATS])
    logits[qk_norm] = float(sown[model_lib.telemetry.STATS]["attn_logit_max"][0])
  assert logits["none"] > 100 and logits["layernorm"] <= math.sqrt(8) + 1e-3


def test_layer_scale_block_matches_numpy(make_config):
  cfg = model_lib.ModelConfig.create(make_config(layer_scale=0.1).model)
  x = _x()
  params, got = _block(cfg, x)
  g_attn, g_mlp = params["attention_layer_scale"], params["mlp_layer_scale"]
  h = x + g_attn * ref.attention(ref._norm(params, "attention_norm", x, cfg.norm_eps),
                                 params["attention"], True)
  expected = h + g_mlp * ref.mlp(ref._norm(params, "mlp_norm", h, cfg.norm_eps),
                                 params["mlp"], "gelu")
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)
  # Initialised to the configured constant.
  fresh = model_lib.init_params(cfg)
  assert np.all(np.asarray(fresh["layer_0"]["attention_layer_scale"]) == np.float32(0.1))


def test_attn_softcap_block_matches_numpy(make_config):
  cfg = model_lib.ModelConfig.create(make_config(attn_softcap=5.0).model)
  x = _x(scale=3.0)
  params, got = _block(cfg, x)
  h = x + ref.attention(ref._norm(params, "attention_norm", x, cfg.norm_eps),
                        params["attention"], True, softcap=5.0)
  expected = h + ref.mlp(ref._norm(params, "mlp_norm", h, cfg.norm_eps), params["mlp"], "gelu")
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)


def test_output_softcap_is_cap_tanh_of_the_plain_logits(make_config):
  plain = make_config()
  capped = make_config(output_softcap=3.0)
  params = model_lib.init_params(plain.model)
  params = jax.tree.map(lambda p: p * 8, params)  # logits well beyond the cap
  tokens = np.random.default_rng(0).integers(0, 32, (2, 16))
  raw = np.asarray(model_lib.forward(plain.model, params, tokens), np.float64)
  got = np.asarray(model_lib.forward(capped.model, params, tokens))
  assert np.abs(raw).max() > 3.0
  np.testing.assert_allclose(got, 3.0 * np.tanh(raw / 3.0), atol=1e-5, rtol=1e-5)


def test_attention_scores_in_float32_do_not_overflow_float16():
  rng = np.random.default_rng(0)
  q = (300 * rng.normal(size=(1, 2, 8, 16))).astype(np.float16)
  k = (300 * rng.normal(size=(1, 2, 8, 16))).astype(np.float16)
  exact = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / 4.0
  assert np.abs(exact).max() > 65504  # the product overflows float16
  plain, _ = layers.attention_scores(jnp.asarray(q), jnp.asarray(k))
  wide, _ = layers.attention_scores(jnp.asarray(q), jnp.asarray(k), scores_dtype=jnp.float32)
  assert not np.isfinite(np.asarray(plain)).all()
  np.testing.assert_allclose(np.asarray(wide), exact, rtol=1e-5)


def test_emb_grad_shrink_scales_the_embedding_gradient_only(make_config):
  base = make_config(tie_embeddings=False)
  shrunk = make_config(tie_embeddings=False, emb_grad_shrink=0.1)
  params = model_lib.init_params(base.model)
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 16)))}
  loss_a, grads_a = _loss_and_grads(base, params, batch)
  loss_b, grads_b = _loss_and_grads(shrunk, params, batch)
  assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-6)  # the forward is unchanged
  np.testing.assert_allclose(grads_b["embedding"], 0.1 * np.asarray(grads_a["embedding"]),
                             rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(grads_b["head"], grads_a["head"], rtol=1e-4, atol=1e-7)


def test_z_loss_adds_the_mean_squared_log_partition(make_config):
  config = make_config()
  config.loss.z_loss = 1e-2
  cfg = model_lib.ModelConfig.create(config.model)
  rng = np.random.default_rng(0)
  logits = (5 * rng.normal(size=(2, 16, 32))).astype(np.float32)
  tokens = rng.integers(0, 32, (2, 16))
  total, terms = loss_lib.objective(cfg, config.loss, jnp.asarray(logits), {"tokens": tokens})
  # Causal: position t predicts token t + 1.
  lg = logits[:, :-1].astype(np.float64)
  log_z = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  ce = np.mean(log_z - np.take_along_axis(lg, tokens[:, 1:, None], -1)[..., 0])
  z = 1e-2 * np.mean(log_z**2)
  assert float(terms["loss"]) == pytest.approx(ce, rel=1e-5)
  assert float(terms["z_loss"]) == pytest.approx(z, rel=1e-5)
  assert float(total) == pytest.approx(ce + z, rel=1e-5)


def test_z_loss_is_logged_by_the_train_step(make_config):
  config = make_config()
  config.loss.z_loss = 1e-4
  state = inprocess.create_train_state(config)
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 16)))}
  _, metrics = jax.jit(steps_lib.make_train_step(config))(state, batch)
  assert 0 < float(metrics["z_loss"]) < 1e-4 * 50


@pytest.mark.parametrize("field", sorted(OPTIONS) + ["z_loss"])
def test_an_option_off_is_the_plain_model_bit_for_bit(make_config, field):
  """Off (the default) adds no operation: in float16, loss and gradients equal those of a config
  that never sets the option; on, they differ (for the options without parameters of their
  own), so the option really is wired in."""
  plain = make_config()
  off, on = make_config(), make_config()
  if field == "z_loss":
    off.loss.z_loss, on.loss.z_loss = 0.0, 1e-2
  else:
    off.model[field], on.model[field] = OPTIONS[field]
    off.model.dtype = on.model.dtype = plain.model.dtype = "float16"
  params = model_lib.init_params(plain.model)
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 16)))}
  loss_plain, grads_plain = _loss_and_grads(plain, params, batch)
  loss_off, grads_off = _loss_and_grads(off, params, batch)
  assert float(loss_off) == float(loss_plain)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(grads_off),
                                                   jax.tree.leaves(grads_plain)))
  if field in ("qk_norm", "layer_scale"):
    return  # they add parameters; on, each is checked against numpy above
  loss_on, grads_on = _loss_and_grads(on, params, batch)
  assert float(loss_on) != float(loss_plain) or not all(
      np.array_equal(a, b) for a, b in zip(jax.tree.leaves(grads_on),
                                           jax.tree.leaves(grads_plain)))


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _shapes(config):
  cfg = model_lib.ModelConfig.create(config.model)
  return nn.unbox(jax.eval_shape(model_lib.boxed_init(cfg), jax.random.key(0)))


@pytest.mark.parametrize("placement_or_option", [
    "sub_ln", "peri_ln", "mix_ln", "rezero", "qk_norm", "layer_scale"])
def test_parameter_count_and_decay_mask(make_config, placement_or_option):
  """Each technique's extra (or missing) parameters, counted by hand; every one it adds is a
  gain or a scale, never decayed."""
  n = 2  # layers: per-layer parameters count twice
  base = make_config(scan_layers=False, num_layers=n)
  d, ff, hd = 32, 64, 8
  norm = 2 * d  # a LayerNorm: scale and bias
  if placement_or_option in ("qk_norm", "layer_scale"):
    config = make_config(scan_layers=False, num_layers=n, **{placement_or_option: OPTIONS[
        placement_or_option][1]})
    # QK-norm: a gain over head_dim for q and one for k per layer, no bias.
    extra = n * 2 * hd if placement_or_option == "qk_norm" else n * 2 * d
  else:
    config = make_config(scan_layers=False, num_layers=n, placement=placement_or_option)
    extra = {"sub_ln": n * (2 * d + 2 * ff), "peri_ln": n * 2 * norm + norm,
             "mix_ln": 0,
             # no norms (two per layer, and the final one), one scalar per layer
             "rezero": -(n * 2 * norm) - norm + n}[placement_or_option]
  assert _count(_shapes(config)) - _count(_shapes(base)) == extra
  mask = model_lib.decay_mask(config.model)
  base_paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(
      model_lib.decay_mask(base.model))}
  added = [(jax.tree_util.keystr(p), decay) for p, decay in
           jax.tree_util.tree_leaves_with_path(mask) if jax.tree_util.keystr(p) not in base_paths]
  assert all(not decay for _, decay in added), added
  if extra > 0:
    assert added


def test_mix_ln_switches_from_post_to_pre_ln_at_its_layer_even_when_scanned(make_config):
  num_layers = 8  # ceil(0.25 * 8) = 2 Post-LN layers
  config = make_config(placement="mix_ln", num_layers=num_layers, causal=True)
  cfg = model_lib.ModelConfig.create(config.model)
  x = _x()
  for index in range(num_layers):
    params, got = _block(cfg, x, index=index)  # a traced index, as under nn.scan
    expected = ref.mix_ln(x.astype(np.float64), params, num_layers, True, cfg.norm_eps, "gelu",
                          index=index)
    np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4, err_msg=str(index))
  assert placements.mix_ln_post_layers(8, 0.25) == 2
  assert placements.mix_ln_post_layers(6, 0.25) == 2 and placements.mix_ln_post_layers(24, 0.3) == 8


def test_sub_ln_gain_and_peri_ln_embedding_norm(make_config):
  assert placements.get("sub_ln").branch_gain(12) == pytest.approx(math.sqrt(math.log(24)))
  names = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(
      _shapes(make_config(placement="peri_ln")))}
  assert "['embedding_norm']['scale']" in names and "['final_norm']['scale']" in names
  without = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(
      _shapes(make_config(placement="peri_ln", peri_ln_embedding_norm=False)))}
  assert names - without == {"['embedding_norm']['scale']", "['embedding_norm']['bias']"}


def test_rezero_starts_as_the_identity(make_config):
  config = make_config(placement="rezero", scan_layers=False)
  cfg = model_lib.ModelConfig.create(config.model)
  params = model_lib.init_params(cfg)
  assert float(params["layer_0"]["rezero"]) == 0.0
  x = _x()
  out = layers.Block(cfg).apply({"params": params["layer_0"]}, x)
  np.testing.assert_array_equal(np.asarray(out), x)


@pytest.mark.slow
@pytest.mark.parametrize("placement", placements.names())
def test_every_placement_trains_with_every_option_on(make_config, placement):
  """All options at once on each placement, in float16 and scanned (a traced layer index):
  they compose, and the stack still learns."""
  # What the placement already has is not asked for twice (its properties say: no norms, a
  # branch scale of its own, q, k and v normalised).
  facts = placements.get(placement)
  config = make_config(placement=placement, dtype="float16", scan_layers=True, num_layers=2,
                       qk_norm="none" if facts.qkv_norm else "rmsnorm",
                       layer_scale=0.0 if facts.branch_scale else 0.5,
                       emb_grad_shrink=0.5, attn_softcap=20.0, output_softcap=15.0,
                       attention_scores_dtype="float32", layernorm_scaling=facts.has_norms)
  config.loss.z_loss = 1e-4
  validation.validate(config)
  losses, metrics = train_losses(config, 12)
  # nGPT's logits are cosines times s_z, which starts at 1: its first steps learn slower.
  assert np.isfinite(losses).all() and losses[-1] < losses[0] - (
      0.1 if placement == "ngpt" else 0.2), losses
  assert float(metrics["z_loss"]) > 0


@pytest.mark.parametrize("overrides,message", [
    ({"model.attn_softcap": 50.0, "model.attention_relax": 32.0},
     "config.model.attn_softcap=50 caps the scores that config.model.attention_relax=32"),
    ({"model.layer_scale": 1e-4, "model.placement": "rezero"},
     "config.model.layer_scale=0.0001 scales the branches"),
    ({"model.qk_norm": "batchnorm"}, "config.model.qk_norm='batchnorm' is not allowed; allowed: none, layernorm, rmsnorm"),
    ({"model.emb_grad_shrink": 0.0}, "config.model.emb_grad_shrink=0.0"),
    ({"loss.z_loss": -1.0}, "config.loss.z_loss=-1.0"),
])
def test_combinations_that_make_no_sense_are_refused(make_config, overrides, message):
  config = make_config()
  config_lib.apply_overrides(config, overrides)
  with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(").replace(
      ".", r"\.").replace("+", r"\+")):
    validation.validate(config)


def test_labels_name_the_techniques(make_config):
  config = make_config(placement="sub_ln", qk_norm="layernorm", attn_softcap=50.0)
  config.loss.z_loss = 1e-4
  assert labels.describe(config) == (
      "Sub-LN | QK-Norm | Attn Softcap=50 | z-loss=0.0001 | Gradient Clip=1")
  optimizer_side = make_config()
  optimizer_side.optimizer.name = "adam_atan2"
  optimizer_side.optimizer.update_clip = 1.0
  optimizer_side.optimizer.skip_spikes = 6.0
  assert labels.describe(optimizer_side) == (
      "Pre-Norm | Adam-atan2 | Update Clip=1 | Skip-Step=6 sd | Gradient Clip=1")


@pytest.mark.parametrize("placement", ["pre_ln", "post_ln", "reordered_ln"])
def test_dyt_in_place_of_every_norm_matches_numpy(make_config, placement):
  """model.norm=dyt: each block norm is gamma * tanh(alpha x) + beta (Zhu et al. 2025), alpha a
  learned scalar initialised to model.dyt_alpha."""
  cfg = model_lib.ModelConfig.create(make_config(norm="dyt", placement=placement,
                                                 dyt_alpha=0.7).model)
  x = _x()
  params, got = _block(cfg, x)
  assert np.shape(params["attention_norm"]["alpha"]) == ()
  block, _ = ref.BLOCKS[placement]
  expected = block(x.astype(np.float64), params, 1, True, cfg.norm_eps, "gelu")
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)
  fresh = model_lib.init_params(cfg)
  assert float(fresh["layer_0"]["mlp_norm"]["alpha"]) == np.float32(0.7)
  assert labels.describe(make_config(norm="dyt")) == "Pre-Norm | DyT | Gradient Clip=1"


@pytest.mark.parametrize("index", [0, 3])
def test_layernorm_scaling_scales_each_norm_by_one_over_sqrt_layer(make_config, index):
  """model.layernorm_scaling: layer l's (1-based) norms' outputs times 1/sqrt(l) (Sun et al.
  2025), with the layer index traced as under nn.scan."""
  cfg = model_lib.ModelConfig.create(make_config(layernorm_scaling=True).model)
  x = _x()
  params, got = _block(cfg, x, index=index)
  s = 1 / math.sqrt(index + 1)
  h = x + ref.attention(s * ref._norm(params, "attention_norm", x, cfg.norm_eps),
                        params["attention"], True)
  expected = h + ref.mlp(s * ref._norm(params, "mlp_norm", h, cfg.norm_eps), params["mlp"],
                         "gelu")
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)
  assert labels.describe(make_config(layernorm_scaling=True)) == (
      "Pre-Norm | LN Scaling | Gradient Clip=1")


@pytest.mark.parametrize("overrides,message", [
    ({"model.norm": "dyt", "model.placement": "rezero"},
     "config.model.norm='dyt' chooses the norms; config.model.placement='rezero' has none"),
    ({"model.norm": "rmsnorm", "model.placement": "rezero"},
     "config.model.norm='rmsnorm' chooses the norms; config.model.placement='rezero' has none"),
    ({"model.qk_norm": "layernorm", "model.placement": "hybrid_norm"},
     "config.model.qk_norm='layernorm' normalises queries and keys, which config.model."
     "placement='hybrid_norm' already normalises (with the values); allowed: 'none'"),
    ({"model.layernorm_scaling": True, "model.placement": "rezero"},
     "config.model.layernorm_scaling=True scales the norms' outputs; config.model.placement="
     "'rezero' has no norms"),
    ({"model.qk_norm": "dyt"}, "config.model.qk_norm='dyt' is not allowed; allowed: none, "
     "layernorm, rmsnorm"),
    ({"model.dyt_alpha": 0.0}, "config.model.dyt_alpha=0.0 is not allowed"),
])
def test_the_2025_norm_options_refuse_what_makes_no_sense(make_config, overrides, message):
  config = make_config()
  config_lib.apply_overrides(config, overrides)
  with pytest.raises(errors.ConfigError) as refused:
    validation.validate(config)
  assert str(refused.value).startswith(message)


@pytest.mark.slow
@pytest.mark.parametrize("scan,use_bias", [(False, True), (True, False)])
def test_qk_clip_rescales_the_heads_whose_logits_exceed_tau(make_config, scan, use_bias):
  """model.qk_clip = tau (Kimi K2's MuonClip): the step's update, then each head with largest
  logit S > tau has W_q and W_k (and their biases) times sqrt(tau / S). Checked against the
  plain step's parameters rescaled in numpy with the per-head logits that step's telemetry
  reports (the same forward pass); and a head's logits on a fixed input then shrink by tau / S
  exactly in real arithmetic."""
  base = dict(num_layers=2, scan_layers=scan, use_bias=use_bias, causal=True)
  plain, clipped = make_config(**base), make_config(**base)
  state = inprocess.create_train_state(plain)
  if use_bias:
    # Biases away from 0, so their scaling shows: the key bias's gradient is 0 (softmax's
    # shift), and from 0 Adam would move it only by each program's own rounding noise.
    rng = np.random.default_rng(4)
    params = jax.tree.map(np.asarray, state.params)
    for i in range(2):
      for name in ("query_bias", "key_bias"):
        bias = params[f"layer_{i}"]["attention"][name]
        params[f"layer_{i}"]["attention"][name] = rng.normal(0, 0.1, bias.shape).astype(bias.dtype)
    state = inprocess.create_train_state(plain, params)
  tokens = np.random.default_rng(3).integers(0, 32, (4, 16)).astype(np.int32)
  batch = {"tokens": jnp.asarray(tokens)}
  after, metrics = jax.jit(steps_lib.make_train_step(plain, telemetry_on=True))(state, batch)
  heads = np.asarray(metrics["telemetry"]["attn_logit_max_per_head"], np.float64)  # [L, H]
  tau = float(np.median(heads))  # about half the heads clipped
  clipped.model.qk_clip = tau
  validation.validate(clipped)
  got, got_metrics = jax.jit(steps_lib.make_train_step(clipped))(state, batch)
  assert int(got_metrics["qk_clipped_heads"]) == int((heads > tau).sum()) > 0
  factor = np.sqrt(np.where(heads > tau, tau / heads, 1.0))
  expected = jax.tree.map(np.asarray, after.params)
  for i in range(2):
    layer = expected["layers"] if scan else expected[f"layer_{i}"]
    for name in ("query", "key"):
      kernel = layer["attention"][name][i] if scan else layer["attention"][name]
      want = kernel * factor[i][None, :, None]
      have = np.asarray((got.params["layers"]["attention"][name][i] if scan
                         else got.params[f"layer_{i}"]["attention"][name]))
      np.testing.assert_allclose(have, want, rtol=2e-6, atol=1e-6)  # another program: rounding
      if use_bias:
        np.testing.assert_allclose(
            np.asarray(got.params[f"layer_{i}"]["attention"][f"{name}_bias"]),
            layer["attention"][f"{name}_bias"] * factor[i][:, None], rtol=2e-6,
            atol=1e-5)  # the key bias: each program's Adam step on a rounding-noise gradient
        assert np.abs(layer["attention"][f"{name}_bias"]).max() > 0.1  # away from 0 (above)
    # Everything else is the plain step's (to rounding: another program).
    have_value = (got.params["layers"]["attention"]["value"][i] if scan
                  else got.params[f"layer_{i}"]["attention"]["value"])
    want_value = (layer["attention"]["value"][i] if scan else layer["attention"]["value"])
    np.testing.assert_allclose(np.asarray(have_value), want_value, rtol=2e-6, atol=1e-6)
  x = np.random.default_rng(5).normal(size=(16, 32))
  q_w = (np.asarray(got.params["layers"]["attention"]["query"][0]) if scan
         else np.asarray(got.params["layer_0"]["attention"]["query"]))
  k_w = (np.asarray(got.params["layers"]["attention"]["key"][0]) if scan
         else np.asarray(got.params["layer_0"]["attention"]["key"]))
  q0 = np.einsum("ld,dhk->hlk", x, q_w / factor[0][None, :, None])
  k0 = np.einsum("ld,dhk->hlk", x, k_w / factor[0][None, :, None])
  q1, k1 = np.einsum("ld,dhk->hlk", x, q_w), np.einsum("ld,dhk->hlk", x, k_w)
  np.testing.assert_allclose(np.einsum("hqk,hsk->hqs", q1, k1),
                             np.einsum("hqk,hsk->hqs", q0, k0) * (factor[0] ** 2)[:, None, None],
                             rtol=1e-9, atol=1e-9)
  assert labels.describe(clipped).startswith("Pre-Norm | QK-Clip=")


@pytest.mark.parametrize("overrides,message", [
    ({"model.qk_clip": 100.0, "model.qk_norm": "layernorm"},
     "config.model.qk_clip=100 rescales W_q and W_k, which config.model.qk_norm='layernorm' "
     "normalises away; use one of them"),
    ({"model.qk_clip": 100.0, "model.attention": "none"},
     "config.model.qk_clip=100 clips attention logits; config.model.attention='none' has none"),
])
def test_qk_clip_refuses_what_it_cannot_act_on(make_config, overrides, message):
  config = make_config()
  config_lib.apply_overrides(config, overrides)
  with pytest.raises(errors.ConfigError) as refused:
    validation.validate(config)
  assert str(refused.value) == message


@pytest.mark.parametrize("overrides,message", [
    ({"model.attention_relax": 32.0},
     "config.model.attention_relax=32.0 relaxes attention scores"),
    ({"model.qk_norm": "rmsnorm"}, "config.model.qk_norm='rmsnorm' normalises queries and keys"),
    ({"model.attn_softcap": 50.0}, "config.model.attn_softcap=50.0 caps attention scores"),
    ({"model.attention_scores_dtype": "float32"},
     "config.model.attention_scores_dtype='float32' sets the dtype of attention scores"),
])
def test_attention_techniques_are_refused_without_attention(make_config, overrides, message):
  """Once trained silently without the technique (issue 45)."""
  config = make_config()
  config_lib.apply_overrides(config, {**overrides, "model.attention": "none"})
  with pytest.raises(errors.ConfigError) as refused:
    validation.validate(config)
  assert str(refused.value) == (message + "; config.model.attention='none' has no attention: "
                                "turn one off")


def _ngpt_axis(path, leaf, scanned: bool):
  """The d_model axis numpy_reference.NGPT_EMBED_AXES gives a parameter (None: a vector left
  alone), shifted past a scanned stack's layer axis."""
  name = str(path[-1].key)
  if name not in ref.NGPT_EMBED_AXES or leaf.ndim < 2:
    return None
  axis = ref.NGPT_EMBED_AXES[name]
  in_stack = scanned and str(path[0].key) == "layers"
  return axis + 1 if in_stack and axis >= 0 else axis


def _renormalised(params, scanned: bool):
  def one(path, leaf):
    leaf = np.asarray(leaf, np.float64)
    axis = _ngpt_axis(path, leaf, scanned)
    return leaf if axis is None else ref.unit(leaf, axis)
  return jax.tree_util.tree_map_with_path(one, params)


def _assert_on_the_sphere(params, scanned: bool):
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    axis = _ngpt_axis(path, np.asarray(leaf), scanned)
    if axis is not None:
      norms = np.sqrt((np.asarray(leaf, np.float64) ** 2).sum(axis))
      np.testing.assert_allclose(norms, 1.0, atol=2e-6, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_ngpt_puts_every_matrix_back_on_the_sphere_after_each_update(make_config, monkeypatch,
                                                                     scan):
  """model.placement=ngpt (Loshchilov et al. 2024, section 2.6): each step is the plain optax
  update, then every matrix divided by its L2 norm along d_model. Over 3 steps, against the same
  step with the renormalisation taken out, its parameters renormalised in numpy along the axes
  numpy_reference writes out per parameter; the initial matrices are on the sphere too."""
  config = make_config(placement="ngpt", num_layers=2, scan_layers=scan, causal=True,
                       use_bias=True)
  validation.validate(config)
  state = inprocess.create_train_state(config)
  _assert_on_the_sphere(state.params, scan)
  ngpt_step = jax.jit(steps_lib.make_train_step(config))
  with monkeypatch.context() as m:  # the same step without the renormalisation, traced here
    m.setattr(model_lib, "onto_sphere", lambda cfg, params: params)
    plain_step = jax.jit(steps_lib.make_train_step(config))
    plain_step.lower(state, {"tokens": jnp.zeros((4, 16), jnp.int32)}).compile()
  rng = np.random.default_rng(0)
  for _ in range(3):
    batch = {"tokens": jnp.asarray(rng.integers(0, 32, (4, 16)).astype(np.int32))}
    plain, _ = plain_step(state, batch)
    state, metrics = ngpt_step(state, batch)
    assert not bool(metrics["skipped"])
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
                         plain.params, state.params)
    assert max(jax.tree.leaves(moved)) > 1e-4  # the renormalisation did act
    jax.tree.map(lambda got, want: np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5,
                                                              atol=2e-6),
                 state.params, _renormalised(plain.params, scan))
    _assert_on_the_sphere(state.params, scan)


@pytest.mark.slow
def test_ngpt_keeps_its_sphere_through_a_skipped_float16_step(make_config):
  """An fp16 overflow skips the step (the loss scale halves): the parameters stay exactly as
  they were, on the sphere, and the next finite step renormalises as usual."""
  config = make_config(placement="ngpt", num_layers=2, causal=True, dtype="float16")
  # The scaled gradients overflow float16 (2^20 does not: probed 2026-12-03, this model).
  config.optimizer.loss_scale.initial_scale = 2.0 ** 28
  state = inprocess.create_train_state(config)
  step = jax.jit(steps_lib.make_train_step(config))
  batch = {"tokens": jnp.asarray(np.random.default_rng(1).integers(0, 32, (4, 16)), jnp.int32)}
  after, metrics = step(state, batch)
  assert bool(metrics["skipped"]) and float(after.loss_scale.scale) == 2.0 ** 27
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               after.params, state.params)
  for _ in range(9):  # halving until the scaled gradients fit
    after, metrics = step(after, batch)
    if not bool(metrics["skipped"]):
      break
  assert not bool(metrics["skipped"]) and int(after.status) == 0
  assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()),
                                          after.params, state.params))) > 0
  _assert_on_the_sphere(after.params, model_lib.ModelConfig.create(config.model).scanned)


@pytest.mark.parametrize("overrides,message", [
    ({"model.norm": "dyt"}, "config.model.norm='dyt' chooses the norms; config.model.placement="
                            "'ngpt' has none"),
    ({"model.input_norm": True}, "config.model.input_norm=True adds a LayerNorm on the "
                                 "embedding; config.model.placement='ngpt'"),
    ({"model.layer_scale": 0.1}, "config.model.layer_scale=0.1 scales the branches that "
                                 "config.model.placement='ngpt' already scales by a learned "
                                 "alpha"),
    ({"model.layernorm_scaling": True}, "config.model.layernorm_scaling=True scales the norms' "
                                        "outputs; config.model.placement='ngpt' has no norms"),
    ({"model.qk_clip": 100.0}, "config.model.qk_clip=100 rescales W_q and W_k, which "
                               "config.model.placement='ngpt' puts back on the unit sphere"),
])
def test_ngpt_refuses_what_it_has_no_place_for(make_config, overrides, message):
  config = make_config(placement="ngpt")
  config_lib.apply_overrides(config, overrides)
  with pytest.raises(errors.ConfigError) as refused:
    validation.validate(config)
  assert str(refused.value).startswith(message)

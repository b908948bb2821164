"""The transformer and its norm-placement factory, checked against independent computations."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy import errors
from normstudy.core import layers
from normstudy.core import model as model_lib
from normstudy.core import placements
from conftest import train_losses
import numpy_reference as ref

PLACEMENTS = placements.names()


def test_reference_table_covers_every_registered_placement():
  assert sorted(ref.BLOCKS) == sorted(PLACEMENTS)


def _param_names(model_cfg):
  """Parameter paths of a model, from its abstract init (nothing is compiled)."""
  cfg = model_lib.ModelConfig.create(model_cfg)
  shapes = jax.eval_shape(model_lib.boxed_init(cfg), jax.random.key(0))
  return {"/".join(str(k.key) for k in path)
          for path, _ in jax.tree_util.tree_leaves_with_path(nn.unbox(shapes))}


@pytest.mark.parametrize("name", PLACEMENTS)
def test_final_norm_and_residual_weight_follow_the_placement(make_config, name):
  names = _param_names(make_config(placement=name).model)
  assert ("final_norm/scale" in names) == ref.BLOCKS[name][1]
  alpha = placements.get(name).residual_alpha(6)
  assert alpha == pytest.approx((12 ** 0.25) if name == "deepnorm" else 1.0)


def _randomized(params, seed):
  """Parameters with every entry random, so norm gains and biases matter too."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: (np.asarray(leaf) + 0.3 * rng.normal(size=leaf.shape)).astype(
      np.float32), params)


def _block_params(cfg, x, seed=0):
  init = jax.jit(lambda key: nn.unbox(layers.Block(cfg).init(key, x)["params"]))
  return jax.tree.map(np.asarray, _randomized(init(jax.random.key(seed)), seed + 1))


@pytest.mark.parametrize("index,name", list(enumerate(PLACEMENTS)))
def test_every_block_matches_its_numpy_reference(make_config, index, name):
  # Alternate placements check the other activation and the biases.
  activation, use_bias = [("gelu_tanh", False), ("gelu", True)][index % 2]
  num_layers = 6
  config = make_config(placement=name, num_layers=num_layers, causal=True,
                       activation=activation, use_bias=use_bias)
  cfg = model_lib.ModelConfig.create(config.model)
  x = np.random.default_rng(0).normal(size=(2, 16, 32)).astype(np.float32)
  params = _block_params(cfg, x)
  got = np.asarray(jax.jit(layers.Block(cfg).apply)({"params": params}, x))
  block, _ = ref.BLOCKS[name]
  expected = block(x.astype(np.float64), params, num_layers, True, cfg.norm_eps, activation)
  np.testing.assert_allclose(got, expected, atol=3e-4, rtol=3e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name,dtype", [("deepnorm", "float32"), ("sub_ln", "float16"),
                                        ("peri_ln", "float16"), ("mix_ln", "float16"),
                                        ("rezero", "float16")])
def test_a_placement_trains(make_config, name, dtype):
  # Every placement's block is checked against its reference above; Pre-LN training is checked
  # in test_steps (float16). Here: stacks end to end, the newer designs in float16 with QK-norm.
  config = make_config(placement=name, dtype=dtype, num_layers=2,  # Mix-LN: one Post-LN layer
                       qk_norm="layernorm" if dtype == "float16" else "none")
  losses, _ = train_losses(config, 25)
  assert np.isfinite(losses).all()
  assert losses[-1] < losses[0] - 0.4, losses


def test_unknown_names_are_one_line_listing_the_registry(make_config):
  with pytest.raises(errors.ConfigError) as e:
    model_lib.init_params(make_config(placement="no_such_block").model, 0)
  assert str(e.value) == ("config.model.placement='no_such_block' is not allowed; allowed: "
                          + ", ".join(PLACEMENTS))
  assert isinstance(e.value, ValueError)  # notebook callers catch ValueError


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
  # Two layers: a leak in the first reaches every position of the second.
  _, _, _, diff = _change_position_9(make_config(causal=True, scan_layers=scan, num_layers=2))
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


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "conv"])
def test_masked_positions_keep_their_position(make_config, kind):
  config = make_config(causal=False, position_embedding=kind)
  params = model_lib.init_params(config.model, 0)
  tokens = np.random.default_rng(0).integers(0, 32, (1, 16)).astype(np.int32)
  mask = np.zeros((1, 16), bool)
  mask[0, [3, 11]] = True
  logits = np.asarray(model_lib.forward(config.model, params, tokens, mask))
  assert np.abs(logits[0, 3] - logits[0, 11]).max() > 1e-4


def test_scan_and_loop_stacks_agree(make_config):
  scanned = make_config(scan_layers=True, num_layers=2)
  looped = make_config(scan_layers=False, num_layers=2)
  params = model_lib.init_params(scanned.model, 0)
  unstacked = {k: v for k, v in params.items() if k != "layers"}
  for i in range(2):
    unstacked[f"layer_{i}"] = jax.tree.map(lambda a: a[i], params["layers"])
  tokens = np.arange(32, dtype=np.int32).reshape(2, 16) % 32
  np.testing.assert_allclose(
      np.asarray(model_lib.forward(scanned.model, params, tokens)),
      np.asarray(model_lib.forward(looped.model, unstacked, tokens)), atol=1e-5)


@pytest.mark.parametrize("init,name", [("xavier", "deepnorm"), ("bert", "deepnorm"),
                                       ("bert", "pre_ln")])
def test_initial_std_of_every_projection(init, name):
  num_layers, d, ff, heads = 3, 256, 1024, 4
  cfg = model_lib.ModelConfig(num_layers=num_layers, d_model=d, num_heads=heads, d_ff=ff,
                              vocab_size=64, max_len=8, placement=name, init=init,
                              use_bias=True, tie_embeddings=False, scan_layers=True)
  params = model_lib.init_params(cfg, 0)
  layers = params["layers"]
  beta = (8 * num_layers) ** -0.25 if name == "deepnorm" else 1.0  # DeepNet's beta
  if init == "bert":  # fairseq's init_bert_params: normal(0.02), DeepNorm's beta on top
    std = lambda fan_in, fan_out, gain: 0.02 * gain
  else:  # Xavier-normal: gain * sqrt(2 / (fan_in + fan_out))
    std = lambda fan_in, fan_out, gain: gain * math.sqrt(2.0 / (fan_in + fan_out))
  expected = {
      ("attention", "query"): std(d, d, 1.0),
      ("attention", "key"): std(d, d, 1.0),
      ("attention", "value"): std(d, d, beta),
      ("attention", "out"): std(d, d, beta),
      ("mlp", "fc1"): std(d, ff, beta),
      ("mlp", "fc2"): std(ff, d, beta),
  }
  for (module, weight), want in expected.items():
    values = np.asarray(layers[module][weight])
    assert values.std() == pytest.approx(want, rel=0.03), (module, weight)
    assert abs(values.mean()) < 0.05 * want
  assert np.asarray(params["embedding"]).std() == pytest.approx(0.02, rel=0.03)
  head_std = 0.02 if init == "bert" else math.sqrt(2.0 / (d + 64))
  assert np.asarray(params["head"]).std() == pytest.approx(head_std, rel=0.05)
  for module, bias in [("attention", "query_bias"), ("attention", "key_bias"),
                       ("attention", "value_bias"), ("attention", "out_bias"),
                       ("mlp", "fc1_bias"), ("mlp", "fc2_bias")]:
    assert not np.asarray(layers[module][bias]).any()


def test_biases_are_optional(make_config):
  without = _param_names(make_config(use_bias=False, causal=False, scan_layers=True,
                                     position_embedding="conv").model)
  with_bias = _param_names(make_config(use_bias=True, causal=False, scan_layers=True,
                                       position_embedding="conv").model)
  added = with_bias - without
  assert added == {f"layers/attention/{w}_bias" for w in ("query", "key", "value", "out")} | {
      "layers/mlp/fc1_bias", "layers/mlp/fc2_bias", "pos_conv/bias"}


def test_input_norm_normalises_the_embedding_output(make_config):
  config = make_config(placement="post_ln", input_norm=True, causal=True, num_layers=1,
                       dropout=0.0, scan_layers=True)
  cfg = model_lib.ModelConfig.create(config.model)
  params = _randomized(model_lib.init_params(cfg, 0), 4)
  params = jax.tree.map(np.asarray, params)
  tokens = np.random.default_rng(2).integers(0, 32, (2, 16)).astype(np.int32)
  positions = np.asarray(layers.sinusoidal_positions(16, 32))
  x = params["embedding"][tokens] + positions
  en = params["embedding_norm"]
  x = ref.layernorm(x, en["scale"], en["bias"], cfg.norm_eps)
  layer = jax.tree.map(lambda a: a[0], params["layers"])
  x = ref.BLOCKS["post_ln"][0](x, layer, 1, True, cfg.norm_eps, cfg.activation)
  expected = x @ params["embedding"].T
  got = np.asarray(model_lib.forward(cfg, params, tokens))
  np.testing.assert_allclose(got, expected, atol=5e-4, rtol=5e-4)


def test_without_attention_a_block_is_its_mlp_alone(make_config):
  """model.attention=none: no attention parameters, and each Pre-LN block is x + MLP(LN(x)),
  transcribed in numpy (tests/numpy_reference.py's MLP)."""
  config = make_config(attention="none", causal=True, num_layers=2, scan_layers=True)
  cfg = model_lib.ModelConfig.create(config.model)
  names = _param_names(config.model)
  assert not [n for n in names if "attention" in n] and "layers/mlp/fc1" in names
  params = jax.tree.map(np.asarray, _randomized(model_lib.init_params(cfg, 0), 4))
  tokens = np.random.default_rng(2).integers(0, 32, (2, 16)).astype(np.int32)
  x = params["embedding"][tokens] + np.asarray(layers.sinusoidal_positions(16, 32))
  for i in range(2):
    layer = jax.tree.map(lambda a, i=i: a[i], params["layers"])
    norm = layer["mlp_norm"]
    x = x + ref.mlp(ref.layernorm(x, norm["scale"], norm["bias"], cfg.norm_eps), layer["mlp"],
                    cfg.activation)
  final = params["final_norm"]
  expected = ref.layernorm(x, final["scale"], final["bias"], cfg.norm_eps) @ params["embedding"].T
  got = np.asarray(model_lib.forward(cfg, params, tokens))
  np.testing.assert_allclose(got, expected, atol=5e-4, rtol=5e-4)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
def test_gelu_runs_in_float32_with_a_finite_gradient_in_float16(name):
  act = layers.ACTIVATIONS.get(name)
  x16 = jnp.asarray([-3.0, -0.5, 0.0, 0.7, 2.5, 148.0, 1e4], jnp.float16)
  y = act(x16)
  assert y.dtype == jnp.float16
  expected = ref.ACTIVATIONS[name](np.asarray(x16, np.float64))
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=2e-3, atol=1e-3)
  grad = jax.grad(lambda v: act(v).astype(jnp.float32).sum())(x16)
  assert np.isfinite(np.asarray(grad, np.float32)).all()
  # d/dx x Phi(x) -> 1 for large x, in either form.
  assert float(grad[-1]) == pytest.approx(1.0)
  assert float(grad[-2]) == pytest.approx(1.0)


def test_the_tanh_gelu_in_float16_would_not_be_finite():
  # Why the activation runs in float32: the tanh form's 0.044715 x^3 overflows float16 at 1e4.
  grad = jax.grad(lambda v: jax.nn.gelu(v, approximate=True).astype(jnp.float32).sum())(
      jnp.asarray([1e4], jnp.float16))
  assert not np.isfinite(np.asarray(grad, np.float32)).all()


def _scores_inputs(value):
  """q, k [1, 1, 2, 8] whose first plain score q.k / sqrt(8) is `value`."""
  q = np.zeros((1, 1, 2, 8), np.float32)
  k = np.zeros((1, 1, 2, 8), np.float32)
  q[0, 0, 0] = math.sqrt(value * math.sqrt(8) / 8)
  k[0, 0, 0] = q[0, 0, 0]
  q[0, 0, 1, 0], k[0, 0, 1, 1] = 1.0, 2.0
  return q, k


def _softmax(scores):
  e = np.exp(scores - scores.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("form", ["pb_relax", "after_product"])
def test_relax_forms_equal_plain_attention_in_float32(form):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 4, 16, 8)).astype(np.float32) * 3
  k = rng.normal(size=(2, 4, 16, 8)).astype(np.float32) * 3
  plain = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8)
  logits, shift = layers.attention_scores(jnp.asarray(q), jnp.asarray(k), 32.0, form)
  np.testing.assert_allclose(np.asarray(logits + shift), plain, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(_softmax(np.asarray(logits)), _softmax(plain), atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_the_fused_kernel_is_softmax_attention(monkeypatch, causal):
  """layers.fused_attention (model.attention_kernel='cudnn') against softmax(q k^T / sqrt(d)) v
  in float64 numpy, on [b, h, l, d] in and out. A CPU has no cuDNN: jax's xla implementation of
  the same call checks the layout, the scale and the causal mask here."""
  monkeypatch.setattr(layers, "FUSED_IMPLEMENTATION", "xla")
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 4, 16, 8)) * 2, jnp.bfloat16) for _ in range(3))
  out = layers.fused_attention(q, k, v, causal)
  assert out.shape == q.shape and out.dtype == jnp.bfloat16
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  scores = np.einsum("bhqd,bhkd->bhqk", q64, k64) / math.sqrt(8)
  if causal:
    scores = np.where(np.tril(np.ones((16, 16), bool)), scores, -np.inf)
  expected = np.einsum("bhqk,bhkd->bhqd", _softmax(scores), v64)
  # bfloat16 has 8 significant bits: the output's own rounding is up to 2^-8 of |out| <= ~4.
  np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=3e-2)
  assert not np.allclose(np.asarray(layers.fused_attention(q, k, v, not causal), np.float64),
                         expected, atol=3e-2)  # the mask is the one asked for


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_the_fused_kernel_changes_no_parameter_and_computes_the_same_model(
    monkeypatch, make_config, causal):
  """The kernel is no parameter: the same tree and initial values; the logits agree with the
  explicit path's to bfloat16 rounding. Telemetry steps read the scores, so they take the
  explicit path: there the two kernels are the same computation, bit for bit."""
  from normstudy.core import telemetry
  monkeypatch.setattr(layers, "FUSED_IMPLEMENTATION", "xla")
  explicit = make_config(dtype="bfloat16", num_layers=2, causal=causal)
  fused = make_config(dtype="bfloat16", num_layers=2, causal=causal, attention_kernel="cudnn")
  params = model_lib.init_params(explicit.model, 0)
  jax.tree.map(np.testing.assert_array_equal, params, model_lib.init_params(fused.model, 0))
  tokens = np.random.default_rng(2).integers(0, 32, (2, 16)).astype(np.int32)
  mask = None if causal else np.random.default_rng(3).random((2, 16)) < 0.3
  want = np.asarray(model_lib.forward(explicit.model, params, tokens, mask))
  got = np.asarray(model_lib.forward(fused.model, params, tokens, mask))
  assert not np.array_equal(got, want)  # the fused path was taken
  np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())

  def with_stats(config):
    cfg = model_lib.ModelConfig.create(config.model)
    model = model_lib.Transformer(cfg, probe=telemetry.Probe(stats=True))
    return model.apply({"params": params}, tokens, mask, mutable=[telemetry.STATS])

  (want, want_stats), (got, got_stats) = with_stats(explicit), with_stats(fused)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  jax.tree.map(np.testing.assert_array_equal, got_stats, want_stats)
  assert "attn_entropy" in str(jax.tree_util.tree_structure(got_stats))


def test_pb_relax_survives_a_float16_score_that_overflows_after_the_product():
  q, k = _scores_inputs(8.7e4)
  plain = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8)
  assert plain.max() == pytest.approx(8.7e4, rel=1e-3) and plain.max() > 65504
  q16, k16 = jnp.asarray(q, jnp.float16), jnp.asarray(k, jnp.float16)
  relaxed, _ = layers.attention_scores(q16, k16, 32.0, "pb_relax")
  after, _ = layers.attention_scores(q16, k16, 32.0, "after_product")
  assert np.isfinite(np.asarray(relaxed)).all()
  assert not np.isfinite(np.asarray(after)).all()
  np.testing.assert_allclose(_softmax(np.asarray(relaxed)), _softmax(plain), atol=2e-3)


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
  # At the factor before the overflow, plain float16 attention is finite, and relax computes
  # the same function: equal to float16 rounding (scores near 2000 round to +-1 there, so the
  # comparison is on the rows' predictions; exact equality is checked in float32 above).
  before = jax.tree_util.tree_map_with_path(
      lambda path, a: a * factor / 2 if str(path[-1].key) in ("query", "key") else a, params)
  plain_logits = np.asarray(model_lib.forward(plain.model, before, tokens))
  relaxed_before = np.asarray(model_lib.forward(relaxed.model, before, tokens))
  assert np.isfinite(plain_logits).all()
  agree = (plain_logits.argmax(-1) == relaxed_before.argmax(-1)).mean()
  assert agree >= 0.9, agree


@pytest.mark.parametrize("width,groups", [(5, 4), (4, 2)])
def test_grouped_conv_matches_a_direct_transcription(width, groups):
  rng = np.random.default_rng(width)
  x = rng.normal(size=(2, 9, 8)).astype(np.float32)
  kernel = rng.normal(size=(width, 8 // groups, 8)).astype(np.float32)
  left = (width - 1) // 2
  expected = np.zeros((2, 9, 8))
  per_group = 8 // groups
  for t in range(9):
    for out in range(8):
      g = out // per_group
      for w in range(width):
        source = t + w - left
        if 0 <= source < 9:
          expected[:, t, out] += x[:, source, g * per_group:(g + 1) * per_group] @ kernel[w, :, out]
  got = np.asarray(layers.grouped_conv1d(jnp.asarray(x), jnp.asarray(kernel), groups))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_decay_mask_is_declared_by_role(make_config):
  for name in PLACEMENTS:
    config = make_config(placement=name, use_bias=True, causal=False, input_norm=True,
                         position_embedding="conv")
    mask = model_lib.decay_mask(config.model)
    flat = {"/".join(str(k.key) for k in path): decays
            for path, decays in jax.tree_util.tree_leaves_with_path(mask)}
    for path, decays in flat.items():
      leaf = path.split("/")[-1]
      # Norm gains, biases and learned branch scales (ReZero, LayerScale, nGPT's alpha and
      # logit scale) are not decayed.
      is_gain_or_bias = leaf in ("scale", "bias", "rezero", "logit_scale") or leaf.endswith(
          ("_bias", "_rezero", "_layer_scale", "_ngpt_alpha"))
      assert decays == (not is_gain_or_bias), (name, path)


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


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape,dims", [((4, 8, 16), (2,)), ((4, 2, 8, 3), (1, 3))])
def test_a_bias_gradient_is_the_sum_accumulated_in_float32_then_rounded(dtype, shape, dims):
  # PyTorch sums a half tensor in float32 and rounds the result (fairseq's --fp16 bias
  # gradients); a sum beyond float16's range is inf, so loss-scale overflow is what it was.
  rng = np.random.default_rng(0)
  y = jnp.asarray(rng.standard_normal(shape), dtype)
  bias = jnp.asarray(rng.standard_normal([shape[d] for d in dims]), jnp.float32)
  # Integers: every sum is exact in float32, so the float32 accumulation has one rounding, to
  # the dtype; float16's partial sums past 2048 would round on the way.
  cotangent = rng.integers(-300, 300, shape).astype(dtype)
  first = tuple(0 if d in dims else slice(None) for d in range(len(shape)))
  cotangent[first] = 30000  # the first bias entry's sum passes float16's largest, 65504

  def objective(y, bias):
    return jnp.sum(layers.add_bias(y, bias, dims).astype(jnp.float32)
                   * jnp.asarray(cotangent, jnp.float32))

  grad_y, grad_bias = jax.grad(objective, (0, 1))(y, bias)
  others = tuple(d for d in range(len(shape)) if d not in dims)
  with np.errstate(over="ignore"):  # the overflowing entry's rounding to float16 is the point
    want = cotangent.astype(np.float64).sum(axis=others).astype(dtype).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(grad_bias), want)
  np.testing.assert_array_equal(np.asarray(grad_y), cotangent)
  assert np.isinf(want.flat[0]) == (dtype == "float16")
  want_forward = (np.asarray(y) + np.expand_dims(np.asarray(bias).astype(dtype), others))
  np.testing.assert_array_equal(np.asarray(layers.add_bias(y, bias, dims)), want_forward)

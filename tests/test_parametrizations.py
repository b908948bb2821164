"""The parametrizations (normstudy.core.parametrizations) against transcriptions of their papers'
tables written here, independently: the whole forward pass in numpy with each table's multipliers,
attention and residual scales; the initial scales; each parameter's learning rate read off one
Adam step; the epsilon and the decay; the loss's backward scale; the refusals; training, float16
without a scaler, and a bit-exact resume."""

import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy import errors
from normstudy.core import model as model_lib
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import steps as steps_lib
from normstudy.experiments import validation
import inprocess
import numpy_reference as ref
import runs


def _config(make_config, parametrization, **model):
  config = make_config(**{"parametrization": parametrization, "num_layers": 3,
                          "base_width": 16, "base_depth": 2, **model})
  if parametrization == "umup":
    config.model.tie_embeddings = False
  return config


def _sinusoidal(length, dim):
  position = np.arange(length)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim))
  table[:, 0::2] = np.sin(position * freq)
  table[:, 1::2] = np.cos(position * freq[: dim // 2])
  return table


# The tables, transcribed. Width multiplier m = d / base_width, depth multiplier m_L = L / base_L.
def _table(p, d, heads, L, base_width, base_depth, vocab, length, causal=True):
  """{name: value} of every multiplier the forward pass uses under parametrization p."""
  hd = d // heads
  m, m_l = d / base_width, L / base_depth
  t = {"attn": 1 / math.sqrt(hd), "attn_out": 1.0, "act": 1.0, "readout": 1.0,
       "hidden": lambda fan_in: 1.0, "branch": lambda i: (1.0, 1.0)}
  if p in ("mup", "completep"):  # TP5 Table 8 + Table 3's 1/d attention (sqrt(d_base) at base)
    t["attn"] = math.sqrt(hd) / hd
    t["readout"] = 1 / m
  if p == "completep":  # Dey et al. Table 1, alpha = 1
    t["branch"] = lambda i: (1 / m_l, 1.0)
  if p == "umup":  # Blake et al. 2024 Table 2 and its unit-scaled operations
    t["attn"] = 1 / hd
    alpha = 1 / (1 + 4 * hd)
    # unit_scaling's scaled_dot_product_attention: ((log S if is_causal else 1) / S) ** 0.5
    uniform = math.sqrt((math.log(length) if causal else 1) / length)
    t["attn_out"] = 1 / math.exp(alpha * math.log(1.0) + (1 - alpha) * math.log(uniform))
    relu_std = math.sqrt((1 - 1 / math.pi) / 2)  # std of relu(N(0, 1))
    a = 1 / (1 + 0.25)
    t["act"] = math.exp(a * math.log(1 / relu_std) + (1 - a) * math.log(2.0))
    t["readout"] = 1 / d
    t["hidden"] = lambda fan_in: fan_in ** -0.5

    def tau_rule(i):
      variances = [1 / L] * (2 * L)  # every residual multiplier 1, depth scale L^-1/2
      tau = variances[i] / (1 + sum(variances[:i]))
      return math.sqrt(tau / (1 + tau)), math.sqrt(1 / (1 + tau))
    t["branch"] = tau_rule
  return t


def _numpy_forward(p, params, tokens, cfg):
  d, heads, L = cfg.d_model, cfg.num_heads, cfg.num_layers
  t = _table(p, d, heads, L, cfg.base_width, cfg.base_depth, cfg.vocab_size, cfg.max_len)
  x = params["embedding"][tokens] + _sinusoidal(cfg.max_len, d)[: tokens.shape[1]]
  eps = cfg.norm_eps

  def attention(h, a):
    q = np.einsum("bld,dhk->blhk", h, a["query"] * t["hidden"](d))
    k = np.einsum("bld,dhk->blhk", h, a["key"] * t["hidden"](d))
    v = np.einsum("bld,dhk->blhk", h, a["value"] * t["hidden"](d))
    s = np.einsum("bqhk,bshk->bhqs", q, k) * t["attn"]
    s = np.where(np.tril(np.ones((h.shape[1],) * 2, bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    context = np.einsum("bhqs,bshk->bqhk", w, v) * t["attn_out"]
    return np.einsum("blhk,hkd->bld", context, a["out"] * t["hidden"](d))

  def mlp(h, f):
    hidden = ref.gelu_exact(h @ (f["fc1"] * t["hidden"](d))) * t["act"]
    return hidden @ (f["fc2"] * t["hidden"](cfg.d_ff))

  for layer in range(L):
    lp = params[f"layer_{layer}"]
    for position, (norm, sub, f) in enumerate((("attention_norm", attention, "attention"),
                                               ("mlp_norm", mlp, "mlp"))):
      branch, skip = t["branch"](2 * layer + position)
      normed = ref.layernorm(x, lp[norm]["scale"], lp[norm]["bias"], eps)
      x = skip * x + branch * sub(normed, lp[f])
  x = ref.layernorm(x, params["final_norm"]["scale"], params["final_norm"]["bias"], eps)
  head = params["embedding"].T if cfg.tie_embeddings else params["head"]
  return x @ (head * t["readout"])


def _randomized(params, seed=1):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: (np.asarray(leaf) + 0.3 * rng.normal(size=leaf.shape)).astype(
      np.float32), params)


@pytest.mark.parametrize("parametrization", ["sp", "mup", "completep", "umup"])
def test_the_forward_pass_is_each_papers_table(make_config, parametrization):
  """Width 32 against base 16 and depth 3 against base 2, so every multiplier differs from 1."""
  config = _config(make_config, parametrization, scan_layers=False)
  cfg = model_lib.ModelConfig.create(config.model)
  params = jax.tree.map(np.asarray, _randomized(model_lib.init_params(config.model, 0)))
  tokens = np.arange(2 * 16).reshape(2, 16) % cfg.vocab_size
  got = np.asarray(model_lib.forward(config.model, params, tokens))
  expected = _numpy_forward(parametrization, jax.tree.map(np.float64, params), tokens, cfg)
  np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_umups_attention_output_rule_follows_the_mask(make_config, causal):
  """U1 (issue 85): an encoder's attention averages all S positions, so unit_scaling's rule is
  sqrt(1 / S) at the uniform end, not the causal sqrt(log S / S) (multiplier 7.75 against 3.84
  at S = 64, d_head = 16: the output sat ~2x below unit scale). Checked against the transcribed
  rule and measured: random unit-scale q, k, v through softmax attention with u-muP's 1/d_head,
  times the multiplier, has standard deviation within 25% of 1."""
  from normstudy.core import parametrizations
  config = _config(make_config, "umup", d_model=64, num_heads=4, max_len=64, causal=causal)
  got = parametrizations.attention_output_multiplier(config.model)
  expected = _table("umup", 64, 4, 3, 16, 2, 64, 64, causal)["attn_out"]
  assert got == pytest.approx(expected, rel=1e-12)
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(8, 4, 64, 16)) for _ in range(3))
  s = np.einsum("bhqk,bhsk->bhqs", q, k) / 16
  if causal:
    s = np.where(np.tril(np.ones((64, 64), bool)), s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  out = np.einsum("bhqs,bhsk->bhqk", w, v) * got
  assert np.std(out) == pytest.approx(1.0, rel=0.25)


@pytest.mark.parametrize("scan", [True, False])
def test_umup_scales_the_residual_by_the_tau_rule_scanned_or_not(make_config, scan):
  config = _config(make_config, "umup", scan_layers=scan)
  config_unrolled = copy.deepcopy(config)
  config_unrolled.model.scan_layers = not scan
  params = model_lib.init_params(config.model, 0)
  tokens = np.arange(16)[None] % 32
  a = model_lib.forward(config.model, params, tokens)
  # The same function of the same parameters in the other layout (stacked <-> per layer).
  other = model_lib.init_params(config_unrolled.model, 0)
  b = model_lib.forward(config_unrolled.model, other, tokens)
  assert np.isfinite(np.asarray(a)).all() and np.isfinite(np.asarray(b)).all()
  cfg = model_lib.ModelConfig.create(config_unrolled.model)
  unrolled = params if not scan else other
  expected = _numpy_forward("umup", jax.tree.map(lambda v: np.asarray(v, np.float64), unrolled),
                            tokens, cfg)
  np.testing.assert_allclose(np.asarray(b if scan else a), expected, rtol=2e-4, atol=2e-4)


@pytest.mark.slow
def test_initial_scales_follow_the_tables(make_config):
  """bert init (normal 0.02): muP divides a hidden matrix's std by sqrt(m); u-muP starts every
  matrix at std 1; the embedding keeps 0.02 under muP."""
  def stds(parametrization, d):
    config = _config(make_config, parametrization, d_model=d, d_ff=4 * d, num_heads=4,
                     init="bert", vocab_size=512, num_layers=1, base_width=64)
    params = model_lib.init_params(config.model, 0)
    layer = params["layer_0"]
    return {"fc1": float(np.std(layer["mlp"]["fc1"])),
            "query": float(np.std(layer["attention"]["query"])),
            "embedding": float(np.std(params["embedding"]))}
  for d in (64, 256):
    sp, mup, umup = stds("sp", d), stds("mup", d), stds("umup", d)
    for name in ("fc1", "query"):
      np.testing.assert_allclose(sp[name], 0.02, rtol=0.05)
      np.testing.assert_allclose(mup[name], 0.02 * math.sqrt(64 / d), rtol=0.05)
      np.testing.assert_allclose(umup[name], 1.0, rtol=0.05)
    np.testing.assert_allclose(mup["embedding"], 0.02, rtol=0.05)
    np.testing.assert_allclose(umup["embedding"], 1.0, rtol=0.05)


@pytest.mark.slow
def test_mups_conv_position_kernel_keeps_its_xavier_variance(make_config):
  """M1 (issue 85): the convolutional positions' kernel is Xavier-normal whatever model.init
  says, variance 2 / (fan_in + fan_out) with fan_in = width x d_model / groups and fan_out =
  width x d_model (variance_scaling's fans with the kernel's taps as its receptive field), so
  already proportional to 1/fan_in: muP keeps it (microsoft/mup: hidden weights at variance
  proportional to 1/fan_in, once), sp equal to muP; once it was shrunk again by m_N^-1/2
  (std 0.0499 against 0.0706 at width 64, base 128)."""
  def kernel_std(parametrization, d):
    config = _config(make_config, parametrization, d_model=d, d_ff=4 * d, num_heads=4,
                     init="bert", num_layers=1, base_width=32, position_embedding="conv")
    params = model_lib.init_params(config.model, 0)
    kernel = np.asarray(params["pos_conv"]["kernel"])
    return float(np.std(kernel)), config.model
  for d in (64, 256):
    (mup, cfg), (sp, _) = kernel_std("mup", d), kernel_std("sp", d)
    fan_in = cfg.conv_pos_width * d // cfg.conv_pos_groups
    fan_out = cfg.conv_pos_width * d
    expected = math.sqrt(2.0 / (fan_in + fan_out))
    np.testing.assert_allclose(mup, expected, rtol=0.05)
    np.testing.assert_allclose(sp, expected, rtol=0.05)


def _expected_rates(parametrization, path, shape, d, d_ff, L, base_width):
  """Each parameter's learning-rate factor, transcribed: muP/CompleteP (TP5 Table 8, Dey et al.
  Table 1 at alpha 1): hidden matrices 1/m; u-muP (Blake et al. Table 2): hidden fan_in^-1/2,
  embedding d^-1/2, readout and other vectors 1, everything inside a block times L^-1/2."""
  name = path[-1]
  hidden = name in ("query", "key", "value", "out", "fc1", "fc2")
  in_block = path[0].startswith("layer_")
  if parametrization in ("mup", "completep"):
    return base_width / d if hidden else 1.0
  if parametrization == "umup":
    fan_in = {"fc2": d_ff}.get(name, d)
    own = fan_in ** -0.5 if hidden else (d ** -0.5 if name == "embedding" else 1.0)
    return own * (L ** -0.5 if in_block else 1.0)
  return 1.0


@pytest.mark.slow
@pytest.mark.parametrize("parametrization", ["sp", "mup", "completep", "umup"])
def test_each_parameter_moves_at_its_tables_rate(make_config, parametrization):
  """One Adam step from zero moments moves each entry by lr x factor x g / (|g| + eps): with
  eps tiny, |update| / lr is each parameter's factor wherever its gradient is not ~0."""
  config = _config(make_config, parametrization, scan_layers=False)
  config.optimizer.update(name="adamw", eps=1e-12, weight_decay=0.0, learning_rate=1e-3,
                          clip_norm=0.0)
  state = inprocess.create_train_state(config)
  batch = {"tokens": jax.random.randint(jax.random.key(1), (4, 16), 0, 32)}
  new, _ = jax.jit(steps_lib.make_train_step(config))(state, batch)
  cfg = model_lib.ModelConfig.create(config.model)
  flat_old = jax.tree_util.tree_flatten_with_path(state.params)[0]
  flat_new = jax.tree.leaves(new.params)
  checked = 0
  for (path, old), updated in zip(flat_old, flat_new):
    keys = [k.key for k in path]
    moved = np.abs(np.asarray(updated) - np.asarray(old)) / 1e-3
    moved = moved[moved > 1e-3 * moved.max()]  # entries whose gradient is not ~0
    want = _expected_rates(parametrization, keys, old.shape, cfg.d_model, cfg.d_ff,
                           cfg.num_layers, cfg.base_width)
    np.testing.assert_allclose(np.median(moved), want, rtol=1e-3, err_msg=str(keys))
    checked += 1
  assert checked > 10


def test_completep_scales_epsilon_and_the_decay_keeps_its_own_rate():
  """Adam's first step with eps multiplied by c: g / (|g| + c eps); and with zero gradient the
  decoupled decay moves a parameter by lr x wd x p whatever its rate factor (tau fixed)."""
  from normstudy.core import config as config_lib
  opt = config_lib.default_config().optimizer
  opt.update(name="adamw", warmup_steps=0, schedule="constant")
  hp = {k: jnp.float32(v) for k, v in dict(
      learning_rate=0.1, end_learning_rate=0.0, warmup_steps=0, schedule_steps=10, clip_norm=0.0,
      weight_decay=0.5, b1=0.9, b2=0.98, eps=1e-3, power=1.0).items()}
  params = {"w": jnp.full((3,), 2.0), "v": jnp.full((3,), 2.0)}
  g = {"w": jnp.array([1e-3, -2e-3, 0.0]), "v": jnp.array([1e-3, -2e-3, 0.0])}
  tx = optimizer_lib.make_optimizer(opt, hp, {"w": True, "v": True}, {"w": 0.25, "v": 1.0},
                                    {"w": 4.0, "v": 1.0})
  updates, _ = tx.update(g, tx.init(params), params)
  for name, rate, c in (("w", 0.25, 4.0), ("v", 1.0, 1.0)):
    gg = np.asarray(g[name], np.float64)
    direction = gg / (np.abs(gg) + c * 1e-3)
    expected = -0.1 * (rate * direction + 0.5 * 2.0)
    np.testing.assert_allclose(np.asarray(updates[name]), expected, rtol=1e-5)


@pytest.mark.slow
def test_mups_untied_readout_is_rescaled_as_mureadout(make_config):
  """M3 (issue 85): microsoft/mup's set_base_shapes calls MuReadout._rescale_parameters, which
  multiplies the sp-initialised head by width_mult^1/2 (its forward then divides by width_mult).
  Under init="xavier" (std sqrt(2 / (d + V)), shrinking with width) the head is that times
  sqrt(d / base_width); under "bert" its normal(0.02) is constant in width and kept."""
  def head_std(parametrization, d, init):
    config = _config(make_config, parametrization, d_model=d, d_ff=4 * d, num_heads=4,
                     init=init, vocab_size=512, num_layers=1, base_width=32,
                     tie_embeddings=False)
    return float(np.std(np.asarray(model_lib.init_params(config.model, 0)["head"])))
  for d in (64, 256):
    xavier = math.sqrt(2.0 / (d + 512))
    np.testing.assert_allclose(head_std("sp", d, "xavier"), xavier, rtol=0.05)
    np.testing.assert_allclose(head_std("mup", d, "xavier"), xavier * math.sqrt(d / 32),
                               rtol=0.05)
    np.testing.assert_allclose(head_std("mup", d, "bert"), 0.02, rtol=0.05)


def test_mups_base_and_attention_scale_are_said_in_one_line(make_config):
  """M2 and M4 (issue 85): under muP the run says its width multiplier and where its base comes
  from (model.base_width, 128 by default where the ladders use 32 and 64), and which attention
  scale it gets (base_head_dim 0: sp's 1/sqrt(d_head), a deliberate default for heads added with
  width); nothing under sp."""
  from normstudy.core import parametrizations
  from normstudy.experiments import preflight
  config = _config(make_config, "mup", d_model=64, num_heads=4, base_width=128, d_ff=256)
  line = preflight.parametrization_note(config)
  assert "\n" not in line
  assert "m_N = d_model 64 / model.base_width=128 (the default) = 0.5" in line
  assert "q.k / sqrt(16) as sp's (model.base_head_dim=0" in line
  assert parametrizations.attention_scale(config.model) == pytest.approx(1 / 4)
  config.model.base_head_dim = 4
  config.model.base_width = 32
  line = preflight.parametrization_note(config)
  assert "model.base_width=32 = 2;" in line and "x sqrt(4) / 16 (1/d_head" in line
  assert parametrizations.attention_scale(config.model) == pytest.approx(2 / 16)
  assert preflight.parametrization_note(_config(make_config, "sp")) == ""


def test_completep_scales_every_parameters_epsilon(make_config):
  """C1 (issue 85): CompleteP's reference multiplies the optimizer's one epsilon by
  1 / (m_N m_L^alpha) before its parameter groups, so embeddings, norms, biases and the readout
  get it as the hidden matrices do (once: the hidden matrices alone)."""
  config = _config(make_config, "completep", d_model=64, num_heads=4, d_ff=256)
  m_n, m_l = 64 / config.model.base_width, config.model.num_layers / config.model.base_depth
  assert (m_n, m_l) == (4.0, 1.5)
  _, eps = model_lib.optimizer_multipliers(config.model)
  leaves = jax.tree_util.tree_leaves_with_path(eps)
  names = {jax.tree_util.keystr(path) for path, _ in leaves}
  assert any("embedding" in n for n in names) and any("scale" in n for n in names)
  for path, factor in leaves:
    assert factor == pytest.approx(1 / (m_n * m_l), rel=1e-12), jax.tree_util.keystr(path)


@pytest.mark.slow
def test_umups_backward_scale_is_undone_before_the_clip(make_config):
  """In float32 the unit-scaled backward changes nothing the optimizer sees: the step's gradient
  norm is jax.grad's of the plain mean loss."""
  from normstudy.core import loss as loss_lib
  config = _config(make_config, "umup")
  config.optimizer.clip_norm = 0.0
  state = inprocess.create_train_state(config)
  batch = {"tokens": jax.random.randint(jax.random.key(1), (4, 16), 0, 32)}
  _, metrics = jax.jit(steps_lib.make_train_step(config))(state, batch)
  cfg = model_lib.ModelConfig.create(config.model)

  def loss(params):
    logits = model_lib.Transformer(cfg).apply({"params": params}, batch["tokens"])
    return loss_lib.cross_entropy(cfg, logits, batch)[0]
  norm = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(jax.grad(loss)(
      state.params)))))
  np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-4)


@pytest.mark.parametrize("change,message", [
    ({"model.parametrization": "completep", "model.placement": "deepnorm"},
     "config.model.parametrization='completep' scales residual branches as derived for Pre-LN; "
     "config.model.placement='deepnorm' is not; allowed: 'pre_ln', or parametrization 'sp' or "
     "'mup'"),
    ({"model.parametrization": "umup"},
     "config.model.parametrization='umup' scales the embedding and the readout differently; "
     "config.model.tie_embeddings=True shares them; allowed: tie_embeddings=False"),
    ({"model.parametrization": "mup", "model.placement": "ngpt"},
     "config.model.parametrization='mup' scales matrices that config.model.placement='ngpt' keeps "
     "on the unit sphere; allowed with ngpt: 'sp'"),
    ({"model.dtype": "float16", "optimizer.loss_scale.kind": "none"},
     "config.optimizer.loss_scale.kind='none' trains float16 without a loss scaler, whose "
     "gradients would underflow or overflow under config.model.parametrization='sp'; allowed: "
     "'dynamic', or parametrization 'umup' (unit-scaled gradients)"),
    ({"model.parametrization": "mup", "model.base_width": 0},
     "config.model.base_width=0 is not allowed; allowed: an integer >= 1"),
])
def test_combinations_that_do_not_make_sense_are_one_line(make_config, change, message):
  from normstudy.core import config as config_lib
  config = make_config()
  config_lib.apply_overrides(config, change)
  with pytest.raises(errors.ConfigError) as e:
    validation.validate(config)
  assert str(e.value) == message


@pytest.mark.slow
@pytest.mark.parametrize("parametrization,dtype", [
    ("mup", "float16"), ("completep", "float32"), ("umup", "float16"), ("umup", "float32")])
def test_each_parametrization_trains(make_config, parametrization, dtype):
  """u-muP in float16 with no loss scaler: its gradients stay finite and the loss falls."""
  from conftest import train_losses
  config = _config(make_config, parametrization, dtype=dtype, num_layers=2)
  if parametrization == "umup":
    config.optimizer.loss_scale.kind = "none"
    config.optimizer.learning_rate = 0.3  # u-muP's base rate: hidden rates are lr / sqrt(fan_in)
  validation.validate(config)
  losses, metrics = train_losses(config, 25)
  assert np.isfinite(losses).all()
  assert losses[-1] < losses[0] - 0.4, losses
  assert int(metrics["skipped_total"]) == 0
  if parametrization == "umup" and dtype == "float16":
    assert float(metrics["loss_scale"]) == 1.0  # no scaler


@pytest.mark.slow
def test_parametrized_runs_resume_bit_exactly(tmp_path):
  """u-muP in float16 without a scaler and CompleteP in float16 with it: 12 steps, then continued
  to 24 from the checkpoint, record the same 24 steps as one run of 24, bit for bit."""
  for name, extra in (
      ("umup", ("--config.model.parametrization=umup", "--config.model.tie_embeddings=False",
                "--config.optimizer.loss_scale.kind=none", "--config.optimizer.learning_rate=1.0")),
      ("completep", ("--config.model.parametrization=completep", "--config.model.base_depth=2",
                     "--config.model.base_width=32"))):
    def run(workdir, steps):
      runs.run_inline("normstudy.main", "--config=configs/seed_figure.py:pre_norm_clip1",
                      f"--workdir={workdir}",
                      *runs.tiny_args(tmp_path / "tfds", num_steps=steps, every=6),
                      "--config.train.log_every=1", "--config.optimizer.schedule=constant",
                      *extra)
    run(tmp_path / name / "whole", 24)
    run(tmp_path / name / "resumed", 12)
    run(tmp_path / name / "resumed", 24)
    whole = runs.trajectory(tmp_path / name / "whole")
    assert [r["step"] for r in whole] == list(range(1, 25))
    assert runs.trajectory(tmp_path / name / "resumed") == whole


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["post_ln", "deepnorm", "sandwich_ln", "sub_ln", "peri_ln",
                                       "mix_ln", "reordered_ln", "rezero"])
def test_mup_trains_with_every_placement_it_allows(make_config, placement):
  """muP's rules are per matrix: they combine with every placement but nGPT (refused above)."""
  from conftest import train_losses
  config = _config(make_config, "mup", placement=placement, num_layers=2)
  validation.validate(config)
  losses, _ = train_losses(config, 15)
  assert np.isfinite(losses).all()
  assert losses[-1] < losses[0] - 0.2, losses


@pytest.mark.slow
def test_a_refused_combination_stops_the_run_before_anything_is_written(tmp_path):
  result = runs.run_module("normstudy.main", "--config=configs/seed_figure.py:pre_norm_clip1",
                           f"--workdir={tmp_path / 'never'}",
                           "--config.model.parametrization=completep",
                           "--config.model.placement=deepnorm", check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: config.model.parametrization='completep' scales residual branches as derived for "
      "Pre-LN; config.model.placement='deepnorm' is not; allowed: 'pre_ln', or parametrization "
      "'sp' or 'mup'"]
  assert not (tmp_path / "never").exists()


def test_each_registered_property_is_what_its_rules_do():
  """Issue 87: a parametrization is a registered object whose properties the config's checks
  read; each property agrees with what the rules compute for it (at twice the base width and
  depth, where every rule departs from sp's)."""
  import types
  from normstudy.core import parametrizations
  for p in parametrizations.REGISTRY.registered():
    cfg = types.SimpleNamespace(parametrization=p.name, d_model=64, base_width=32, num_layers=8,
                                base_depth=4, num_heads=4, base_head_dim=0, init="bert",
                                max_len=16, causal=False, dropout=0.0, activation="gelu",
                                vocab_size=32)
    assert (parametrizations.lr_multiplier(cfg, "hidden", 64, True) == 0.5) == p.width_rules
    assert (parametrizations.residual_scales(cfg, 0) == (0.5, 1.0)) == p.depth_rules, p.name
    assert (parametrizations.eps_multiplier(cfg, "vector") == 0.25) == p.depth_rules
    assert parametrizations.unit_init(cfg, "hidden") == p.unit_scaled
    assert parametrizations.scales_loss_backward(cfg) == p.unit_scaled
    assert (p.label == "") == (p.name == "sp") and p.changes
  with pytest.raises(errors.ConfigError, match="model.parametrization='nup' is not allowed"):
    parametrizations.get("nup")

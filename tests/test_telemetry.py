"""Telemetry and the non-finite locator, against independent computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from normstudy.core import loss as loss_lib
from normstudy.core import model as model_lib
from normstudy.core import steps as steps_lib
from normstudy.core import telemetry
from normstudy.records import keys
from normstudy.records import schema
import inprocess
import numpy_reference as ref
from conftest import USER_COMPILER_OPTIONS


def _positions(length, dim):
  pos = np.arange(length)[:, None]
  freq = np.exp(-np.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim))
  table[:, 0::2] = np.sin(pos * freq)
  table[:, 1::2] = np.cos(pos * freq)
  return table


def _layer(params, scan, i):
  if scan:
    return jax.tree.map(lambda a: np.asarray(a[i], np.float64), params["layers"])
  return jax.tree.map(lambda a: np.asarray(a, np.float64), params[f"layer_{i}"])


def _norm(tree):
  return np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree)))


@pytest.mark.slow
@pytest.mark.parametrize("scan", [True, False])
def test_telemetry_matches_independent_computations(make_config, scan):
  config = make_config(scan_layers=scan, causal=True, placement="pre_ln", activation="gelu_tanh",
                       num_layers=2)
  config.optimizer.weight_decay = 0.1
  state = inprocess.create_train_state(config)
  tokens = np.random.default_rng(0).integers(0, 32, (4, 16)).astype(np.int32)
  params = jax.tree.map(np.asarray, state.params)
  new_state, metrics = jax.jit(steps_lib.make_train_step(config, telemetry_on=True))(
      state, {"tokens": jnp.asarray(tokens)})
  tel = jax.tree.map(np.asarray, metrics["telemetry"])
  new_params = jax.tree.map(np.asarray, new_state.params)

  # Forward pass in numpy: residual stream, attention and MLP layer by layer.
  eps = config.model.norm_eps
  x = params["embedding"][tokens].astype(np.float64) + _positions(16, 32)
  causal = np.tril(np.ones((16, 16), bool))
  for i in range(2):
    p = _layer(params, scan, i)
    # Pre-LN's norms are given the residual stream itself.
    assert tel["attn_norm_input_rms"][i] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-4)
    h = ref.layernorm(x, p["attention_norm"]["scale"], p["attention_norm"]["bias"], eps)
    q = np.einsum("bld,dhk->blhk", h, p["attention"]["query"])
    k = np.einsum("bld,dhk->blhk", h, p["attention"]["key"])
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(8)
    assert tel["attn_logit_max"][i] == pytest.approx(scores[..., causal].max(), rel=1e-4)
    per_head = np.where(causal, scores, -np.inf).max(axis=(0, 2, 3))
    np.testing.assert_allclose(tel["attn_logit_max_per_head"][i], per_head, rtol=1e-4)
    masked = np.where(causal, scores, -np.inf)
    probs = np.exp(masked - masked.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    entropy = -np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1)), 0).sum(-1)
    assert tel["attn_entropy"][i] == pytest.approx(entropy.mean(), rel=1e-4)
    x = x + ref.attention(h, p["attention"], causal=True)
    assert tel["mlp_norm_input_rms"][i] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-4)
    h = ref.layernorm(x, p["mlp_norm"]["scale"], p["mlp_norm"]["bias"], eps)
    assert tel["mlp_preact_absmax"][i] == pytest.approx(np.abs(h @ p["mlp"]["fc1"]).max(),
                                                       rel=1e-4)
    x = x + ref.mlp(h, p["mlp"])
    assert tel["act_rms"][i] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-4)
    assert tel["resid_absmax"][i] == pytest.approx(np.abs(x).max(), rel=1e-4)
    assert tel["param_norm"][i] == pytest.approx(_norm(p), rel=1e-5)
    step = jax.tree.map(lambda a, b: a - b, _layer(new_params, scan, i), p)
    assert tel["update_norm"][i] == pytest.approx(_norm(step), rel=1e-3)
  final = ref.layernorm(x, params["final_norm"]["scale"], params["final_norm"]["bias"], eps)
  logits = final @ params["embedding"].T
  assert tel["output_logit_max"] == pytest.approx(logits.max(), rel=1e-4)
  log_z = np.log(np.exp(logits).sum(-1))
  assert tel["log_z_mean"] == pytest.approx(log_z.mean(), rel=1e-5)

  # Per-layer gradient norms: a part of the global norm, and each a direct norm of the gradient.
  assert np.sum(tel["grad_norm"] ** 2) <= float(metrics["grad_norm"]) ** 2 * (1 + 1e-5)
  cfg = model_lib.ModelConfig.create(config.model)
  grads = jax.jit(jax.grad(lambda prm: loss_lib.cross_entropy(
      cfg, model_lib.Transformer(cfg).apply({"params": prm}, tokens), {"tokens": tokens})[0]))(
          inprocess.create_train_state(config).params)
  for i in range(2):
    assert tel["grad_norm"][i] == pytest.approx(_norm(_layer(grads, scan, i)), rel=1e-4)
  flat = telemetry.flatten(tel)
  assert flat["resid_absmax/layer_1"] == tel["resid_absmax"][1]
  assert flat["attn_logit_max/layer_1/head_3"] == tel["attn_logit_max_per_head"][1][3]
  assert not any(k.endswith("head_4") for k in flat)  # 4 heads: 0 to 3
  assert keys.parse_layer_key("attn_logit_max/layer_1/head_3") is None  # not a layer metric
  assert keys.parse_layer_key("attn_entropy/layer_12") == ("attn_entropy", 12)
  assert keys.parse_layer_key("loss") is None


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["post_ln", "deepnorm", "rezero"])
def test_norm_input_telemetry_is_what_each_norm_is_given(make_config, placement):
  """Post-LN's norms are given alpha x + F(x) (DeepNet's growing LN input); ReZero has none."""
  config = make_config(causal=True, placement=placement, activation="gelu_tanh", num_layers=2)
  state = inprocess.create_train_state(config)
  tokens = np.random.default_rng(1).integers(0, 32, (4, 16)).astype(np.int32)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), state.params)
  _, metrics = jax.jit(steps_lib.make_train_step(config, telemetry_on=True))(
      state, {"tokens": jnp.asarray(tokens)})
  tel = jax.tree.map(np.asarray, metrics["telemetry"])
  if placement == "rezero":
    assert np.isnan(tel["attn_norm_input_rms"]).all()
    assert np.isnan(tel["mlp_norm_input_rms"]).all()
    return
  eps = config.model.norm_eps
  alpha = (2 * 2) ** 0.25 if placement == "deepnorm" else 1.0  # DeepNet: (2N)^(1/4), N = 2
  x = params["embedding"][tokens] + _positions(16, 32)
  for i in range(2):
    p = _layer(params, "layers" in params, i)
    before = alpha * x + ref.attention(x, p["attention"], causal=True)
    assert tel["attn_norm_input_rms"][i] == pytest.approx(np.sqrt(np.mean(before**2)), rel=1e-4)
    x = ref.layernorm(before, p["attention_norm"]["scale"], p["attention_norm"]["bias"], eps)
    before = alpha * x + ref.mlp(x, p["mlp"])
    assert tel["mlp_norm_input_rms"][i] == pytest.approx(np.sqrt(np.mean(before**2)), rel=1e-4)
    x = ref.layernorm(before, p["mlp_norm"]["scale"], p["mlp_norm"]["bias"], eps)
    assert tel["act_rms"][i] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-4)


@pytest.mark.slow  # two programs at XLA's full optimization: a fifth of the fast suite's time
def test_telemetry_step_updates_state_like_the_plain_step(make_config):
  config = make_config(dtype="float16")
  batch = {"tokens": jnp.asarray(np.random.default_rng(1).integers(0, 32, (4, 16)), jnp.int32)}
  state = inprocess.create_train_state(config)

  def run(telemetry_on):
    step = jax.jit(steps_lib.make_train_step(config, telemetry_on=telemetry_on))
    return step.lower(state, batch).compile(compiler_options=USER_COMPILER_OPTIONS)(state, batch)

  (a, _), (b, _) = run(False), run(True)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _located(locate, state, batch):
  """Where the forward pass of `state` on `batch` first goes non-finite."""
  return telemetry.first_nonfinite(jax.device_get(locate(state, batch)))


@pytest.mark.parametrize("scan", [True, False])
def test_locator_names_the_first_non_finite_site(make_config, scan):
  config = make_config(dtype="float16", scan_layers=scan, num_layers=3)
  config.train.on_nonfinite = "skip"
  batch = {"tokens": jnp.asarray(np.random.default_rng(2).integers(0, 32, (4, 16)), jnp.int32)}
  state = inprocess.create_train_state(config)

  def scaled(path_predicate, factor):
    return state.replace(params=jax.tree_util.tree_map_with_path(
        lambda path, a: a * factor if path_predicate(path) else a, state.params))

  def in_layer(path, layer, name):
    keys = [str(getattr(k, "key", k)) for k in path]
    return keys[-1] == name and (keys[0] == f"layer_{layer}" if not scan else keys[0] == "layers")

  # Layer 1's fc1 scaled by 1e6: its MLP pre-activation overflows float16 (65504) first.
  if scan:
    def grow(path, a):
      return a.at[1].multiply(1e6) if in_layer(path, 1, "fc1") else a
    blown = state.replace(params=jax.tree_util.tree_map_with_path(grow, state.params))
  else:
    blown = scaled(lambda path: in_layer(path, 1, "fc1"), 1e6)
  locate = jax.jit(steps_lib.make_locate_step(config))
  site = _located(locate, blown, batch)
  assert site == schema.Site(1, "mlp_preact")
  assert site.sentence() == "layer 1 MLP pre-activation"
  # A NaN in the embedding table poisons the first site.
  nan_embedding = state.replace(params={**state.params, "embedding": jnp.full_like(
      state.params["embedding"], jnp.nan)})
  assert _located(locate, nan_embedding, batch) == schema.Site(None, "embedding")
  # A finite forward pass (what an fp16 step whose scaled backward overflowed leaves): the
  # failure was in the backward pass only.
  assert _located(locate, state, batch) == schema.BACKWARD_ONLY


# Restored without a target, orbax reads the shardings from the checkpoint and says so.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_update_size_is_the_change_of_the_outputs_between_checkpoints(tmp_path):
  """metrics.jsonl's update_size at step t is ||f(x; theta_t) - f(x; theta_t-1)|| on the first
  eval batch, and accumulated_update ||f(x; theta_t) - f(x; theta_0)||: recomputed here from
  the checkpointed parameters of consecutive steps and the initial ones, two forward passes
  and the norm in numpy; a run resumed after step 2 records the same values."""
  import orbax.checkpoint as ocp
  from configs import seed_figure
  from normstudy.core import config as config_lib
  from normstudy.data import batches as batches_lib
  from normstudy.data import sources as data_lib
  from normstudy.experiments import planning
  import runs
  workdir = tmp_path / "run"
  settings = {"model.num_layers": 1, "model.d_model": 16, "model.num_heads": 2,
              "model.d_ff": 32, "model.max_len": 16, "model.vocab_size": 32,
              "model.dtype": "float32", "train.batch_size": 4, "data.train_tokens": 16384,
              "data.validation_tokens": 4096, "train.eval_steps": 2, "train.tensorboard": False,
              "data.data_dir": str(tmp_path / "tfds"), "train.num_steps": 4,
              "train.eval_every": 4, "train.checkpoint_every": 1, "train.max_to_keep": 5,
              "optimizer.warmup_steps": 1, "optimizer.learning_rate": 0.01,
              "optimizer.schedule": "constant", "train.update_size_steps": 3}

  def config_of(**changes):
    config = seed_figure.get_config("pre_norm_clip1")
    config_lib.apply_overrides(config, {**settings, **changes})
    return config

  # In-process: the records are the engine's (the command around it is tested elsewhere).
  planning.train_and_evaluate(config_of(), str(workdir))
  records = {r["step"]: r for r in runs.records(workdir)}
  recorded = {step: r.get("update_size") for step, r in records.items()}
  accumulated = {step: r.get("accumulated_update") for step, r in records.items()}
  # Step 1 trains at the warm-up's learning rate 0: nothing moves; none after step 3.
  assert records[1]["lr"] == 0 and recorded[1] == 0.0 and recorded[4] is None
  assert accumulated[1] == 0.0 and accumulated[4] is None

  # Stopped after step 2, then continued: the accumulated update still starts from theta_0.
  resumed = tmp_path / "resumed"
  for num_steps in (2, 4):
    planning.train_and_evaluate(config_of(**{"train.num_steps": num_steps}), str(resumed))
  again = {r["step"]: r for r in runs.records(resumed)}
  assert [again[s].get("accumulated_update") for s in (1, 2, 3)] == [
      accumulated[s] for s in (1, 2, 3)]
  assert again[3]["update_size"] == recorded[3]

  config = config_of()
  batch = batches_lib.eval_batches(config, data_lib.load_splits(config))[0]
  model = model_lib.Transformer(model_lib.ModelConfig.create(config.model), deterministic=True)
  apply = jax.jit(model.apply)  # one program, not one per operation

  def outputs(step):
    state = ocp.PyTreeCheckpointer().restore(str(workdir / "checkpoints" / str(step) / "state"))
    params = jax.tree.map(lambda x: np.asarray(x)[0], state["params"])  # the run axis
    return np.asarray(apply({"params": params}, batch["tokens"], batch.get("mask")),
                      np.float64)

  for step in (2, 3):
    change = outputs(step) - outputs(step - 1)
    expected = np.sqrt(np.mean(np.sum(change ** 2, axis=-1)))
    assert recorded[step] == pytest.approx(expected, rel=1e-4)
  initial = jax.tree.map(np.asarray, inprocess.create_train_state(config).params)
  start = np.asarray(apply({"params": initial}, batch["tokens"], batch.get("mask")),
                     np.float64)
  for step in (2, 3):
    change = outputs(step) - start
    expected = np.sqrt(np.mean(np.sum(change ** 2, axis=-1)))
    assert accumulated[step] == pytest.approx(expected, rel=1e-4)
  assert accumulated[3] != pytest.approx(recorded[3], rel=1e-2)  # two measures, not one

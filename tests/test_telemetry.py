"""Telemetry against independent computations; spike detection and observations on synthetic
trajectories with known events."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from normstudy import analysis
from normstudy import steps as steps_lib
import numpy_reference as ref


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


@pytest.mark.parametrize("scan", [True, False])
def test_telemetry_matches_independent_computations(make_config, scan):
  config = make_config(scan_layers=scan, causal=True, placement="pre_ln")
  config.optimizer.weight_decay = 0.1
  state = steps_lib.create_train_state(config)
  tokens = np.random.default_rng(0).integers(0, 32, (4, 16)).astype(np.int32)
  params = jax.tree.map(np.asarray, state.params)
  new_state, metrics = jax.jit(steps_lib.make_train_step(config, telemetry=True))(
      state, {"tokens": jnp.asarray(tokens)})
  tel = jax.tree.map(np.asarray, metrics["telemetry"])
  new_params = jax.tree.map(np.asarray, new_state.params)

  # Forward pass in numpy: residual stream and attention logits layer by layer.
  eps = config.model.norm_eps
  x = params["embedding"][tokens].astype(np.float64) + _positions(16, 32)
  causal = np.tril(np.ones((16, 16), bool))
  for i in range(2):
    p = _layer(params, scan, i)
    h = ref.layernorm(x, p["attention_norm"]["scale"], p["attention_norm"]["bias"], eps)
    q = np.einsum("bld,dhk->blhk", h, p["attention"]["query"])
    k = np.einsum("bld,dhk->blhk", h, p["attention"]["key"])
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(8)
    assert tel["attn_logit_max"][i] == pytest.approx(scores[..., causal].max(), rel=1e-4)
    x = x + ref.attention(h, p["attention"], causal=True)
    x = x + ref.mlp(ref.layernorm(x, p["mlp_norm"]["scale"], p["mlp_norm"]["bias"], eps), p["mlp"])
    assert tel["act_rms"][i] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-4)
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
  plain_state = steps_lib.create_train_state(config)
  grads = jax.grad(lambda prm: steps_lib.cross_entropy(
      steps_lib.model_lib.ModelConfig.create(config.model),
      steps_lib.model_lib.forward(config.model, prm, tokens), {"tokens": tokens})[0])(
          plain_state.params)
  for i in range(2):
    assert tel["grad_norm"][i] == pytest.approx(_norm(_layer(grads, scan, i)), rel=1e-4)


def test_telemetry_step_updates_state_like_the_plain_step(make_config):
  config = make_config(dtype="float16")
  batch = {"tokens": jnp.asarray(np.random.default_rng(1).integers(0, 32, (4, 16)), jnp.int32)}
  a, _ = jax.jit(steps_lib.make_train_step(config))(steps_lib.create_train_state(config), batch)
  b, _ = jax.jit(steps_lib.make_train_step(config, telemetry=True))(
      steps_lib.create_train_state(config), batch)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trajectory(steps=600, seed=0, spikes=(), diverge_at=None):
  rng = np.random.default_rng(seed)
  t = np.arange(1, steps + 1)
  loss = 4.0 * np.exp(-t / 150) + 2.0 + rng.normal(0, 0.03, steps)
  for step, height in spikes:
    loss[step - 1:step + 2] += height  # a 3-step spike
  if diverge_at:
    loss[diverge_at - 1:] = np.nan
  return pd.Series(loss, index=t)


def test_spike_detector_finds_exactly_the_injected_spikes():
  injected = [(150, 1.0), (320, 0.6), (480, 2.0)]
  events = analysis.spikes(_trajectory(spikes=injected))
  assert [e["step"] for e in events] == [150, 320, 480]
  clean = lambda t: 4.0 * np.exp(-np.asarray(t) / 150) + 2.0
  for event, (step, height) in zip(events, injected):
    # "Above trend" is above the median of the previous 50 steps, which lags a falling loss.
    lag = np.median(clean(np.arange(step - 50, step))) - clean(step)
    assert event["excursion"] == pytest.approx(height - lag, abs=0.1)
  assert analysis.spikes(_trajectory(seed=3)) == []


def test_divergence_and_scale_collapse():
  loss = _trajectory(diverge_at=400)
  assert analysis.divergence_step(loss, warmup_steps=10) == 400
  assert analysis.divergence_step(_trajectory(), warmup_steps=10) is None
  rising = pd.Series([3.0, 2.0, 2.5, 3.5], index=[1, 2, 3, 4])
  assert analysis.divergence_step(rising, warmup_steps=2) == 4
  scale = pd.Series([128, 256, 128, 64, 64, 128, 32, 64], index=range(1, 9), dtype=float)
  seen = analysis.scale_collapses(scale)
  assert seen["scale_halvings"] == 3 and seen["lowest_scale"] == 32
  assert seen["lowest_scale_step"] == 7
  assert seen["halvings_per_1k"] == pytest.approx(3 / 8 * 1000)


def _write_run(path, label, loss, scale, telemetry_layers=0):
  path.mkdir(parents=True)
  with open(path / "metrics.jsonl", "w") as f:
    for step, (l, s) in enumerate(zip(loss, scale), start=1):
      record = {"step": step, "loss": l, "grad_norm": 1.0, "clipped": False, "lr": 1e-3,
                "loss_scale": s, "skipped": False, "skipped_total": 0}
      if telemetry_layers and step % 10 == 0:
        for i in range(telemetry_layers):
          record[f"attn_logit_max/layer_{i}"] = float(i + step / 100)
          record[f"act_rms/layer_{i}"] = 1.0 + i
          record[f"grad_norm/layer_{i}"] = 0.1 * (i + 1)
      f.write(json.dumps(record) + "\n")
  (path / "config.json").write_text(json.dumps({"label": label, "optimizer": {
      "warmup_steps": 10}}))


def test_observations_and_heatmaps_from_the_data(tmp_path):
  spiky = _trajectory(spikes=[(200, 1.0), (350, 0.8), (500, 1.5)]).to_list()
  calm = _trajectory(seed=5).to_list()
  scale = [2.0**15] * 300 + [2.0**14] * 100 + [2.0**3] * 200
  _write_run(tmp_path / "a", "Spiky", spiky, scale, telemetry_layers=3)
  _write_run(tmp_path / "b", "Calm", calm, [1.0] * 600)
  outputs = analysis.analyze(str(tmp_path))
  summary = pd.read_csv(tmp_path / "summary.csv").set_index("label")
  assert summary.loc["Spiky", "loss_spikes"] == 3 and summary.loc["Calm", "loss_spikes"] == 0
  assert summary.loc["Spiky", "first_spike_step"] == 200
  assert summary.loc["Spiky", "scale_halvings"] == 2
  text = (tmp_path / "observations.md").read_text()
  assert "Loss spiked 3 times, first at step 200" in text
  assert "fell as low as 2^3 at step 401" in text
  assert "No loss spikes." in text
  assert "Most loss spikes: Spiky (3); fewest: Calm (0)." in text
  assert "The largest attention logit was 8.0 (layer 2, step 600)" in text
  for metric in ("attn_logit_max", "act_rms", "grad_norm"):
    png = (tmp_path / f"layers_{metric}.png").read_bytes()
    assert png.startswith(b"\x89PNG") and outputs[f"layers_{metric}"].endswith(".png")
  table = analysis.layer_values(analysis.load_runs(str(tmp_path)), "a", "act_rms")
  assert table.shape == (3, 60) and list(table.iloc[:, 0]) == [1.0, 2.0, 3.0]

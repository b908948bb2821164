"""The learning-rate sensitivity analysis against hand computations, on run directories written
here (the analysis reads files, so no training is needed)."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normstudy import analysis
from normstudy.analysis import sensitivity
from normstudy.analysis import sensitivity_plots

LRS = (1e-3, 1e-2, 1e-1)
INIT = 5.5
FLOOR = 1.9


def _write_run(directory, arm, arm_label, lr, seed, losses, eval_loss, status="finished",
               nonfinite_at=None, logit=None, depth=None):
  os.makedirs(directory)
  overrides = {"optimizer.learning_rate": lr, "train.seed": seed}
  if depth is not None:
    overrides["model.num_layers"] = depth
  point = ", ".join([f"lr={lr:g}", f"seed={seed}"] + ([f"layers={depth}"] if depth else []))
  info = {"label": f"{arm_label} | {point}", "arm": arm, "arm_label": arm_label,
          "point": overrides, "status": status, "entropy_floor": FLOOR}
  if status == "halted":
    layer, site = nonfinite_at
    info.update(halt_step=len(losses), halt_reason="non-finite loss",
                nonfinite_at=f"layer {layer} {site}",
                nonfinite_site={"layer": layer, "site": site})
  with open(os.path.join(directory, "run.json"), "w") as f:
    json.dump(info, f)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"optimizer": {"learning_rate": lr, "warmup_steps": 0},
               "train": {"num_steps": 4}, "model": {"dtype": "float16"}}, f)
  with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
    for step, loss in enumerate(losses, start=1):
      record = {"step": step, "loss": loss, "grad_norm": 1.0, "clipped": False,
                "loss_scale": 128.0, "skipped": False, "skipped_total": 0}
      if logit is not None:
        record["attn_logit_max/layer_0"] = logit * step / len(losses)
        record["attn_logit_max/layer_1"] = logit / 2
      if step == len(losses) and eval_loss is not None:
        record["eval_loss"] = eval_loss
      f.write(json.dumps(record) + "\n")


# arm -> lr -> seed -> (final eval loss or None for a run that halted, where it died)
FINALS = {
    "steady": {1e-3: {0: 3.0, 1: 3.2}, 1e-2: {0: 2.5, 1: 2.7}, 1e-1: {0: 2.6, 1: 2.5}},
    "fragile": {1e-3: {0: 2.9, 1: 3.1}, 1e-2: {0: 2.4, 1: 2.4},
                1e-1: {0: (1, "residual stream"), 1: (0, "attention scores")}},
}
LABELS = {"steady": "Post-Norm | DeepNorm", "fragile": "Pre-Norm"}


def _write_sweep(root, finals=FINALS, depth=None):
  for arm, by_lr in finals.items():
    for lr, by_seed in by_lr.items():
      for seed, final in by_seed.items():
        name = f"lr{lr:g}_seed{seed}" + (f"_layers{depth}" if depth else "")
        directory = os.path.join(root, arm, name)
        if isinstance(final, tuple):
          _write_run(directory, arm, LABELS[arm], lr, seed, [INIT, 4.0, float("nan")], None,
                     status="halted", nonfinite_at=final, logit=1e4, depth=depth)
        else:
          _write_run(directory, arm, LABELS[arm], lr, seed, [INIT, 4.0, final + 0.1], final,
                     logit=10.0 * lr * 1e3, depth=depth)


def _hand_sensitivity(lrs, losses, init):
  """Wortsman et al. 2023's LR sensitivity written out plainly."""
  capped = [min(loss, init) for loss in losses]
  best = min(capped)
  return sum(c - best for c in capped) / len(capped), best, lrs[capped.index(best)]


def test_lr_sensitivity_matches_hand_computation():
  lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
  losses = [3.0, 2.5, 2.55, 2.8, 9.0]  # the last one failed beyond init: capped at init
  expected, best, best_lr = _hand_sensitivity(lrs, losses, INIT)
  got = sensitivity.lr_sensitivity(lrs, losses, INIT)
  assert got["lr_sensitivity"] == pytest.approx(expected)
  assert got["lr_sensitivity"] == pytest.approx((0.5 + 0 + 0.05 + 0.3 + 3.0) / 5)
  assert (got["best_loss"], got["best_lr"]) == (best, best_lr)
  # Within 0.1 nats of 2.5: 3e-3 and 1e-2 (contiguous), not 3e-2 (2.8).
  assert (got["lr_range_low"], got["lr_range_high"]) == (3e-3, 1e-2)
  assert got["lr_range_decades"] == pytest.approx(math.log10(1e-2 / 3e-3))


def test_lr_sensitivity_takes_the_widest_near_best_stretch_in_any_grid_order():
  lrs = [1e-1, 1e-4, 1e-3, 1e-2, 3e-1]
  losses = [2.0, 2.05, 3.0, 2.02, 2.08]  # sorted: 1e-4 ok, 1e-3 no, 1e-2..3e-1 ok
  got = sensitivity.lr_sensitivity(lrs, losses, INIT)
  assert (got["lr_range_low"], got["lr_range_high"]) == (1e-2, 3e-1)
  assert got["best_lr"] == 1e-1


@pytest.mark.slow  # the whole analysis of a 12-run sweep, every figure drawn as PNG and SVG
def test_sweep_summary_deaths_and_observations(tmp_path, monkeypatch):
  monkeypatch.setenv("NORMSTUDY_FIGURE_FORMATS", "svg")  # the suite writes PNG alone (conftest)
  root = str(tmp_path / "sweep")
  _write_sweep(root)
  outputs = analysis.analyze(root)
  for key in ("lr_sensitivity", "lr_attn_logit", "deaths_figure", "summary", "deaths", "run_table",
              "observations"):
    assert os.path.getsize(outputs[key]) > 0, key
  assert os.path.exists(os.path.join(root, "lr_sensitivity.svg"))

  summary = pd.read_csv(os.path.join(root, "summary.csv")).set_index("arm")
  for arm, by_lr in FINALS.items():
    means = [np.mean([INIT if isinstance(v, tuple) else v for v in by_lr[lr].values()])
             for lr in LRS]
    expected, best, best_lr = _hand_sensitivity(list(LRS), means, INIT)
    row = summary.loc[arm]
    assert row.lr_sensitivity == pytest.approx(expected)
    assert row.best_loss == pytest.approx(best)
    assert row.best_lr == pytest.approx(best_lr)
    assert row.runs == 6 and row.seeds == 2
    assert row.label == LABELS[arm]  # the arm's label, without the sweep point
  assert summary.loc["fragile"].halted == 2 and summary.loc["steady"].halted == 0
  assert summary.loc["fragile"].halted_share == pytest.approx(2 / 6)
  # steady's seed means: 3.1, 2.6, 2.55; 2.6 is within 0.1 nats of the best.
  assert summary.loc["steady"].best_lr == pytest.approx(1e-1)
  assert summary.loc["steady"].lr_range_low == pytest.approx(1e-2)
  assert summary.loc["fragile"].max_attn_logit == pytest.approx(1e4)

  deaths = pd.read_csv(os.path.join(root, "deaths.csv"))
  dead = deaths[deaths["count"] > 0]
  assert sorted(zip(dead.arm, dead.learning_rate, dead.kind, dead.layer)) == [
      ("fragile", 0.1, "attention scores", 0), ("fragile", 0.1, "residual stream", 1)]
  # Every arm x learning rate appears, deaths or not.
  assert len(deaths.groupby(["arm", "learning_rate"])) == 6

  runs = pd.read_csv(os.path.join(root, "runs.csv"))
  assert len(runs) == 12 and {"status", "effective_loss", "learning_rate"} <= set(runs.columns)

  text = open(outputs["observations"]).read()
  # steady's sensitivity is lower (fragile pays the whole init gap at 1e-1); the two are compared
  # by Welch's t-test on each seed's own sensitivity, computed here by hand.
  assert "LR sensitivity of the arms that learned: Post-Norm | DeepNorm" in text
  per_seed = {arm: [_hand_sensitivity(list(LRS), [
      INIT if isinstance(by_lr[lr][seed], tuple) else by_lr[lr][seed] for lr in LRS], INIT)[0]
      for seed in (0, 1)] for arm, by_lr in FINALS.items()}
  p = scipy_stats.ttest_ind(per_seed["steady"], per_seed["fragile"], equal_var=False).pvalue
  verdict = "different" if p < 0.05 else "not separated"
  assert f"{verdict} (Welch's t-test, n = 2 and 2, p = {p:.2g})" in text
  assert "residual stream of layer 1 (1 run)" in text and "attention scores of layer 0" in text
  assert "standard errors" not in text and "meaningful" not in text
  # The best learning rate of fragile (1e-2) is inside the grid; steady's (1e-1) is its edge.
  assert "Optimum not bracketed: the best learning rate is at the grid's edge for " \
         "Post-Norm | DeepNorm (0.1)" in text


def test_halted_runs_are_drawn_at_the_top_not_dropped(tmp_path):
  root = str(tmp_path / "sweep")
  _write_sweep(root)
  df = analysis.load_runs(root)
  runs = sensitivity.table(df, analysis.summarize(df))
  fig = sensitivity_plots.sensitivity_figure(runs)
  ax = fig.axes[0]
  crosses = [line for line in ax.lines if line.get_marker() == "X" and len(line.get_xdata())]
  drawn = sum(len(line.get_xdata()) for line in crosses)
  assert drawn == 2  # the two halted runs of "fragile" at 1e-1
  for line in crosses:
    assert np.all(np.asarray(line.get_ydata()) > INIT)  # above every curve
    assert np.allclose(np.asarray(line.get_xdata()), 0.1, rtol=0.1)
  # The fragile curve reaches the loss at init at 1e-1 (both seeds failed), not dropped.
  fragile = [line for line in ax.lines if line.get_label() == "Pre-Norm"][0]
  assert list(fragile.get_xdata()) == list(LRS)
  assert fragile.get_ydata()[-1] == pytest.approx(INIT)


def test_a_depth_axis_gets_its_own_panel(tmp_path):
  root = str(tmp_path / "sweep")
  _write_sweep(os.path.join(root, "d4"), depth=4)
  _write_sweep(os.path.join(root, "d12"), depth=12)
  df = analysis.load_runs(root)
  by_arm = sensitivity.summarize(sensitivity.table(df, analysis.summarize(df)))
  assert sorted(by_arm.group) == ["layers=12", "layers=12", "layers=4", "layers=4"]
  fig = sensitivity_plots.sensitivity_figure(sensitivity.table(df, analysis.summarize(df)))
  assert sorted(ax.get_title() for ax in fig.axes) == ["layers=12", "layers=4"]


def test_a_study_without_a_learning_rate_axis_keeps_its_per_run_summary(tmp_path):
  root = str(tmp_path / "study")
  _write_run(os.path.join(root, "a"), "a", "Pre-Norm", 1e-3, 0, [INIT, 3.0], 2.9)
  outputs = analysis.analyze(root)
  assert "lr_sensitivity" not in outputs
  assert list(pd.read_csv(outputs["summary"]).run) == ["a"]


def test_a_death_kind_is_the_words_of_the_recorded_site_id_or_an_older_records_words():
  assert sensitivity.death_kind({"layer": 2, "site": "resid_attn"}) == (
      "residual stream after attention")
  assert sensitivity.death_kind({"layer": 2, "site": "resid_mlp"}) == (
      "residual stream after the MLP")
  assert sensitivity.death_kind({"layer": None, "site": "backward"}) == "backward pass only"
  # run.json written before ids were stored: its words are the kind.
  assert sensitivity.death_kind({"layer": 0, "site": "residual stream"}) == "residual stream"
  assert sensitivity.death_kind({"layer": 0, "site": "attention scores"}) == "attention scores"
  assert sensitivity.death_kind({"layer": 0, "site": "elsewhere"}) == "not located"
  assert sensitivity.death_kind(None) == "not located"
  assert all(kind in sensitivity_plots.KIND_COLORS for kind in sensitivity.DEATH_KINDS)

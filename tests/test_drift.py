"""The drift experiment's report (normstudy.analysis.horizon_report, drift_series) on a
fabricated workdir whose runs drift at a known rate: each run's last-layer residual absmax grows
as 10^(r step / 100) with r = C lr^K, so its killing series, its slope, the first quarter's
predicted failure step and the drift rate's power are known in closed form; the failure steps
follow, so the law's slope is -K ln 10 by construction. And the experiment's declaration,
checked before anything is written."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from normstudy.analysis import drift_series
from normstudy.analysis import horizon_report
from normstudy.errors import UserError
from normstudy.experiments import drift_runs
from normstudy.records import schema

LIMIT = drift_series.FLOAT16_MAX
K, C = 1.5, 200.0  # decades per 100 steps = C lr^K
WARMUP, LAYERS = 20, 2
LRS = [0.02, 0.03, 0.045, 0.068, 0.1]
SEEDS = (0, 1, 2)


FACTOR = {"a": 1.0, "b": 1.5}  # arm b drifts 1.5x as fast as arm a at every rate


def _rate(lr, arm="a"):
  return C * lr ** K * FACTOR[arm]


def _start(seed):
  return 10.0 * 3.0 ** seed  # the absmax at step 0, by seed: failure times differ by seed


def _crossing(lr, seed, arm="a"):
  """The step where the absmax crosses float16's limit (continuous)."""
  return 100 * math.log10(LIMIT / _start(seed)) / _rate(lr, arm)


def _write_run(directory, arm, lr, seed, num_steps, weight_decay=0.01, log_every=5,
               telemetry_every=5):
  os.makedirs(directory, exist_ok=True)
  crossing = _crossing(lr, seed, arm)
  failed_at = next((s for s in range(log_every, num_steps + 1, log_every) if s >= crossing),
                   None)
  halt = failed_at + 20 if failed_at is not None and failed_at + 20 <= num_steps else None
  last = halt if halt is not None else num_steps
  records = []
  for step in range(log_every, last + 1, log_every):
    bad = failed_at is not None and step >= failed_at
    record = {"step": step, "loss": math.nan if bad else 4.0 - 0.0005 * step,
              "skipped": bad, "loss_scale": 2.0 ** 15 / (2.0 ** (step - failed_at) if bad else 1),
              "grad_norm": 1.0}
    if step % telemetry_every == 0 and not bad:
      absmax = _start(seed) * 10 ** (_rate(lr, arm) * step / 100)
      for layer in range(LAYERS):  # the last layer the largest
        record[f"resid_absmax/layer_{layer}"] = absmax / (LAYERS - layer)
        record[f"attn_logit_max/layer_{layer}"] = 30.0 + layer
      record["output_logit_max"] = 10.0
    records.append(record)
  if halt is None and failed_at is None:
    records[-1]["eval_loss"] = 3.0
  with open(os.path.join(directory, schema.METRICS), "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  info = {"name": os.path.basename(directory), "arm": arm, "arm_label": f"Arm {arm}",
          "label": f"Arm {arm} | lr={lr:g}, seed={seed}",
          "point": {"optimizer.learning_rate": lr, "train.seed": seed},
          "status": schema.HALTED if halt is not None else schema.FINISHED, "last_step": last}
  if halt is not None:
    info.update(halt_step=halt, halt_reason="loss scale at its minimum (0.0001)")
  with open(os.path.join(directory, schema.RUN), "w", encoding="utf-8") as f:
    json.dump(info, f)
  config = {"optimizer": {"weight_decay": weight_decay, "warmup_steps": WARMUP,
                          "loss_scale": {"min_scale": 1e-4}},
            "train": {"num_steps": num_steps}, "model": {"dtype": "float16"}}
  with open(os.path.join(directory, schema.CONFIG), "w", encoding="utf-8") as f:
    json.dump(config, f)


def _plan(arms, decays, heldout_arms, steps=200, heldout_steps=400):
  return {"config": "fabricated", "arms": arms, "decay_arms": decays, "num_steps": steps,
          "heldout": {"arms": heldout_arms, "steps": heldout_steps, "seeds": list(SEEDS),
                      "fractions": [0.2, 0.5, 0.8]}, "commands": []}


@pytest.fixture(autouse=True)
def fewer_draws(monkeypatch):
  """The held-out shift test's bootstrap at 200 draws: its calibration is test_law.py's."""
  monkeypatch.setattr(horizon_report, "SHIFT_DRAWS", 200)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("drift"))
  for arm in ("a", "b"):
    for lr in LRS:
      for seed in SEEDS:
        _write_run(os.path.join(root, "fit", arm, f"lr{lr:g}_seed{seed}"), arm, lr, seed, 200)
  with open(os.path.join(root, schema.DRIFT_PLAN), "w", encoding="utf-8") as f:
    json.dump(_plan(["a", "b"], {"a": 0.01}, ["a"]), f)
  # The prediction, then held-out runs at its rates, twice the fit's horizon, drifting as the
  # fit's: here, so that no test depends on another having run first (the suite's workers
  # take a file's tests in any order).
  prediction = horizon_report.predict(root)
  for lr in prediction.lr:
    for seed in SEEDS:
      _write_run(os.path.join(root, "heldout", "a", f"lr{lr:g}_seed{seed}"), "a", lr, seed, 400)
  return root


@pytest.mark.slow
def test_the_drift_measures_match_the_fabricated_growth(workdir):
  outputs = horizon_report.analyze(workdir)
  drift = pd.read_csv(outputs["drift"])
  killers = pd.read_csv(outputs["drift_killers"])
  # The last layer's absmax is the largest candidate: it kills every failed run.
  assert set(killers.series) == {"resid_absmax/layer_1"}
  assert all(killers.runs == killers.failed_runs)
  # Its slope is the fabricated rate in decades per 100 steps, exactly (a straight line), where
  # a run lived long enough for MIN_POINTS telemetry steps after its warm-up.
  measured = drift[drift.points >= drift_series.MIN_POINTS]
  assert drift.slope_per_100_steps.isna().sum() == len(drift) - len(measured) <= 3
  assert np.allclose(measured.slope_per_100_steps,
                     [_rate(r.lr, r.arm) for r in measured.itertuples()], rtol=1e-9)
  # The first quarter's line reaches the limit where the series does.
  predicted = drift.dropna(subset=["predicted_failure_step"])
  assert len(predicted) > 0
  expected = [_crossing(r.lr, r.seed, r.arm) for r in predicted.itertuples()]
  assert np.allclose(predicted.predicted_failure_step, expected, rtol=1e-6)
  # Every failed run failed at the first logged step past its crossing.
  failed = drift.dropna(subset=["failure_step"])
  assert all(0 <= r.failure_step - _crossing(r.lr, r.seed, r.arm) < 5
             for r in failed.itertuples())
  rates = pd.read_csv(outputs["drift_rates"]).set_index("arm")
  assert rates.k["a"] == pytest.approx(K, abs=1e-9)
  assert rates.k["b"] == pytest.approx(K, abs=1e-9)


@pytest.mark.slow
def test_the_law_and_the_held_out_horizon_of_the_fabricated_world(workdir):
  outputs = horizon_report.analyze(workdir)
  fits = pd.read_csv(outputs["law_fit"]).set_index("arm")
  # T = 100 log10(limit / start) / (C lr^K): ln T falls K ln 10 per decade of lr (to within the
  # 5 steps between logged steps, on failures at steps 60-200, and the seeds' three starts,
  # which are not a normal spread).
  assert fits.b["a"] == pytest.approx(-K * math.log(10), rel=0.1)
  critical = pd.read_csv(outputs["critical_lr_law"])
  row = critical[(critical.arm == "a") & (critical.horizon == 480)].iloc[0]
  # The seeds' median start is seed 1's: lr*(480) solves crossing(lr, 1) = 480 (logged every 5).
  exact = (100 * math.log10(LIMIT / _start(1)) / (480 * C)) ** (1 / K)
  assert row.low <= exact <= row.high
  assert bool(critical[critical.horizon == horizon_report.MERT_STEPS].extrapolated.all())
  held = pd.read_csv(outputs["horizon_heldout"])
  assert len(held) == 3 and set(held.runs) == {3}
  assert held.inside.all()  # the held-out runs follow the law the fit saw
  tests = pd.read_csv(outputs["law_tests"])
  pair = tests[(tests.family == "arms") & tests.test.str.contains("one slope")].iloc[0]
  assert pair.p > 0.05  # b drifts as a, 1.5x faster: one slope, its times shorter
  shifted = tests[(tests.family == "arms") & tests.test.str.contains("one law")].iloc[0]
  assert shifted.p < 0.05
  text = open(outputs["observations"], encoding="utf-8").read()
  assert "resid_absmax/layer_1" in text and "held at 3 of 3" in text


def test_the_prediction_is_written_once_and_kept(workdir):
  path = os.path.join(workdir, schema.DRIFT_PREDICTION)
  before = open(path, encoding="utf-8").read()
  os.utime(path, (0, 0))
  horizon_report.predict(workdir)
  assert open(path, encoding="utf-8").read() == before and os.stat(path).st_mtime == 0


def _declared(drift=None, heldout=None, **changes):
  """A drift Experiment of two arms and one weight decay, with `changes` to its Drift and
  `heldout` to its Heldout."""
  import dataclasses

  from normstudy.core import config as config_lib
  from normstudy.core.experiment import Drift, Experiment, Heldout
  held = dataclasses.replace(Heldout(arms=("a",), steps=200, seeds=(0, 1, 2),
                                     fractions=(0.2, 0.5, 0.8)), **(heldout or {}))
  declared = Drift(law_arms=("a", "b"), decay_base="a", weight_decays={"a_wd0": 0.0},
                   num_steps=100, heldout=held)
  return Experiment(base=config_lib.default_config,
                    arms={"a": ("A", {"optimizer.weight_decay": 0.01}), "b": ("B", {}),
                          "a_wd0": ("A", {"optimizer.weight_decay": 0.0})},
                    drift=dataclasses.replace(declared, **changes))


def test_the_declared_experiment_is_recorded_whole():
  plan = drift_runs.experiment("f.py", _declared())
  assert plan["decay_arms"] == {"a": 0.01, "a_wd0": 0.0}
  assert plan["heldout"] == {"arms": ["a"], "steps": 200, "seeds": [0, 1, 2],
                             "fractions": [0.2, 0.5, 0.8]}
  argv = drift_runs.heldout_argv(plan, "/w", "a", [0.01, 0.02], workers=1)
  assert "--axis=optimizer.learning_rate=0.01,0.02" in argv
  assert "--config.train.num_steps=200" in argv and "--config=f.py:a" in argv


@pytest.mark.parametrize("changes,message", [
    ({"heldout": {"steps": 150}},
     "heldout.steps=150 is not allowed; allowed: at least 2 x num_steps"),
    ({"heldout": {"arms": ("c",)}}, "the held-out arms c are not among the law's arms"),
    ({"law_arms": ("a", "z")}, "z not among its EXPERIMENT's arms"),
    ({"heldout": {"fractions": (0.5, 1.0)}}, "heldout.fractions=(0.5, 1.0) is not allowed"),
    ({"num_steps": 0}, "num_steps=0 is not allowed"),
])
def test_a_bad_declaration_is_one_line_naming_it(changes, message):
  with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
    drift_runs.experiment("f.py", _declared(**changes))


def test_a_workdir_holding_another_experiment_is_refused(tmp_path):
  plan = drift_runs.experiment("f.py", _declared())
  drift_runs.write_plan(str(tmp_path), plan)
  assert drift_runs.write_plan(str(tmp_path), dict(plan))["arms"] == ["a", "b"]
  other = drift_runs.experiment("f.py", _declared(heldout={"steps": 300}))
  with pytest.raises(UserError, match="holds another drift experiment"):
    drift_runs.write_plan(str(tmp_path), other)


@pytest.mark.slow
def test_the_drift_command_trains_predicts_before_the_held_out_runs_and_resumes(tmp_path):
  import runs
  workdir = tmp_path / "drift"
  tiny = [a for a in runs.TINY if "telemetry_every" not in a]  # the fixture's telemetry kept
  sweep_args = [f"--sweep_arg={a}" for a in
                [*tiny, f"--config.data.data_dir={tmp_path / 'tfds'}"]]
  args = ("--config=tests/fixtures/drift_tiny.py", f"--workdir={workdir}", "--workers=1",
          *sweep_args)
  result = runs.run_module("normstudy.drift", *args)
  assert "critical_lr_law:" in result.stdout and "drift:" in result.stdout
  plan = json.loads((workdir / schema.DRIFT_PLAN).read_text())
  assert plan["heldout"]["steps"] == 48 and len(plan["commands"]) == 2
  prediction = pd.read_csv(workdir / schema.DRIFT_PREDICTION)
  held = pd.read_csv(workdir / "horizon_heldout.csv")
  assert list(held.lr) == list(prediction.lr) and list(held.runs) == [2]
  # The prediction was on disk before any held-out run wrote its first record.
  first_record = min(os.stat(p).st_mtime for p in
                     (workdir / "heldout").rglob(schema.METRICS))
  assert os.stat(workdir / schema.DRIFT_PREDICTION).st_mtime <= first_record
  for name in ("law_fit", "critical_lr_law", "law_tests", "drift", "drift_killers"):
    assert (workdir / f"{name}.csv").exists()
  critical = pd.read_csv(workdir / "critical_lr_law.csv")
  assert set(critical.arm) == {"pre_norm_clip1", "post_norm_deepnorm_clip1",
                               "pre_norm_clip1_wd0"}
  # Re-running trains nothing and keeps the prediction as it was.
  before = (workdir / schema.DRIFT_PREDICTION).read_text()
  again = runs.run_module("normstudy.drift", *args)
  assert "held-out runs done" in again.stdout
  assert (workdir / schema.DRIFT_PREDICTION).read_text() == before
  assert not list((workdir / "heldout").rglob("*.tmp"))

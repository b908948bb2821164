"""The headroom ladder's law (normstudy.analysis.headroom_ladder) on fabricated rungs whose
headroom is a known plane in ln width, ln depth and ln step plus a per-run offset and noise: the
coefficients, the extrapolation and the held-out judgement checked against the plane computed
here; the prediction written once; a ladder file's held-out rungs checked before anything is
written."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from normstudy.analysis import headroom_ladder
from normstudy.errors import UserError
from normstudy.experiments import ladder_runs

C0, CW, CD, CT = 20.0, -1.2, -0.8, -0.5  # bits; per e-fold of width, depth, step
WARMUP = 100


def _plane(width, depth, step):
  return C0 + CW * math.log(width) + CD * math.log(depth) + CT * math.log(step)


def _write_rung(root, width, depth, arms=("a", "b"), seeds=(0, 1, 2), steps=2000, rng=None):
  """A rung directory: headroom.csv for every arm and seed (arm b 3 bits lower), and each run's
  config.json with its warm-up. The first telemetry points, inside the warm-up, are far off
  the plane: the fit must drop them."""
  rng = rng or np.random.default_rng(0)
  directory = os.path.join(root, "float16", f"L{depth}_d{width}")
  rows = []
  for arm in arms:
    for seed in seeds:
      run = f"{arm}/seed{seed}"
      os.makedirs(os.path.join(directory, run), exist_ok=True)
      with open(os.path.join(directory, run, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"optimizer": {"warmup_steps": WARMUP}}, f)
      offset = rng.normal(0, 0.2)
      for step in range(50, steps + 1, 50):
        value = _plane(width, depth, step) - (3.0 if arm == "b" else 0.0) + offset
        value += rng.normal(0, 0.05)
        if step <= WARMUP:
          value += 10.0
        rows.append({"arm": arm, "parametrization": "sp", "width": width, "depth": depth,
                     "step": step, "seed": seed, "series": "least", "headroom": value,
                     "learning_rate": 3e-3, "dtype": "float16", "layer": "resid_absmax",
                     "run": run})
  pd.DataFrame(rows).to_csv(os.path.join(directory, "headroom.csv"), index=False)


RUNGS = [(64, 4), (128, 4), (256, 4), (64, 8)]


def test_the_law_recovers_the_plane_and_extrapolates_it(tmp_path):
  rng = np.random.default_rng(1)
  for width, depth in RUNGS:
    _write_rung(str(tmp_path), width, depth, rng=rng)
  rows = headroom_ladder.collect(str(tmp_path))
  assert set(rows.rung) == {f"float16/L{d}_d{w}" for w, d in RUNGS}
  fitted = headroom_ladder.laws(rows)
  law = fitted[("a", "sp", 3e-3, "least")]
  assert law.runs == 3 * len(RUNGS) and law.points == len(RUNGS) * 3 * 38  # warm-up dropped
  for i, truth in enumerate((C0, CW, CD, CT)):
    value, low, high = law.coefficient(i)
    assert low < truth < high, (i, value, low, high)
    assert value == pytest.approx(truth, abs=2.0 if i == 0 else 0.25)  # c0: far from the data
  table = headroom_ladder.fit_table(fitted)
  row = table[(table.arm == "a")].iloc[0]
  assert row.width_per_doubling == pytest.approx(CW * math.log(2), abs=0.2)
  assert (row.width_min, row.width_max, row.depth_max, row.step_max) == (64, 256, 8, 2000)
  out = headroom_ladder.extrapolate(fitted, 1024, 24, 100_000)
  for arm, shift in (("a", 0.0), ("b", 3.0)):
    got = out[out.arm == arm].iloc[0]
    truth = _plane(1024, 24, 100_000) - shift
    assert got.low < truth < got.high
    assert got.headroom == pytest.approx(truth, abs=1.5)
    assert (got.width_beyond, got.depth_beyond, got.step_beyond) == (4.0, 3.0, 50.0)
    assert got.reaches_zero == (got.low <= 0)
    assert got.varied == "width,depth,step"


def test_the_held_out_rung_is_predicted_once_then_judged(tmp_path):
  rng = np.random.default_rng(2)
  for width, depth in RUNGS:
    _write_rung(str(tmp_path), width, depth, rng=rng)
  heldout = [(512, 4, 2000), (64, 16, 2000)]
  first = headroom_ladder.write_prediction(str(tmp_path), heldout)
  assert len(first) == 2 * 2  # arms x held-out rungs
  for p in first.itertuples():
    truth = _plane(p.width, p.depth, p.step) - (3.0 if p.arm == "b" else 0.0)
    assert p.low < truth < p.high
  # The held-out rungs train; the prediction is not rewritten from data that includes them.
  _write_rung(str(tmp_path), 512, 4, rng=rng)
  _write_rung(str(tmp_path), 64, 16, rng=rng)
  again = headroom_ladder.write_prediction(str(tmp_path), heldout)
  pd.testing.assert_frame_equal(again, pd.read_csv(tmp_path / headroom_ladder.PREDICTION))
  np.testing.assert_allclose(again.predicted, first.predicted)
  outputs = headroom_ladder.analyze(str(tmp_path), 1024, 24, 100_000)
  judged = pd.read_csv(outputs["headroom_heldout"])
  assert (judged.runs == 3).all()
  measured = judged[(judged.arm == "a") & (judged.width == 512)].measured.iloc[0]
  assert measured == pytest.approx(_plane(512, 4, 2000), abs=0.5)
  assert judged.inside.all()


def test_no_data_writes_no_prediction(tmp_path):
  got = headroom_ladder.write_prediction(str(tmp_path), [(512, 4, 2000)])
  assert got.empty and not (tmp_path / headroom_ladder.PREDICTION).exists()


def _ladder(heldout):
  from normstudy.core.experiment import Experiment, Ladder
  return Experiment(ladder=Ladder(rungs=((4, 64), (4, 128), (16, 64)), heldout=heldout,
                                  rung_steps=lambda num_layers, d_model: 100))


def test_a_held_out_rung_must_be_a_rung_of_the_file():
  with pytest.raises(UserError, match="must name rungs of its rungs"):
    ladder_runs.headroom_heldout(_ladder(((4, 512),)), "f.py")
  with pytest.raises(UserError, match="holds out every rung"):
    ladder_runs.headroom_heldout(_ladder(((4, 64), (4, 128), (16, 64))), "f.py")
  assert ladder_runs.headroom_heldout(_ladder(((16, 64),)), "f.py") == {(16, 64)}


def test_the_declared_ladder_holds_out_its_largest_width_and_depth():
  from configs import headroom_ladder
  declared = headroom_ladder.EXPERIMENT
  held = ladder_runs.headroom_heldout(declared, "configs/headroom_ladder.py")
  widths = [d for layers, d in declared.ladder.rungs if layers == 4]
  depths = [layers for layers, d in declared.ladder.rungs if d == 64]
  assert held == {(4, max(widths)), (max(depths), 64)}
  overrides = declared.ladder.rung_overrides
  assert overrides(4, 512)["train.num_steps"] == headroom_ladder.LARGE_STEPS
  assert "train.num_steps" not in overrides(4, 64)

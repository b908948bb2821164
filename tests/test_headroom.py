"""Headroom (normstudy.analysis.headroom) on fabricated runs whose telemetry is known: every
value checked against log2 computed here from the published limits (IEEE 754 half precision's
largest finite value, (2 - 2^-10) x 2^15 = 65,504) and the fp16 scaler's floor."""

import json
import math
import os

import numpy as np
import pytest

from normstudy.analysis import drift_series
from normstudy.analysis import headroom
from normstudy.analysis import runs as runs_lib
from normstudy.records import schema

HALF_MAX = (2 - 2 ** -10) * 2 ** 15
MIN_SCALE = 1e-4


def write_run(directory, *, dtype="float16", arm="a", seed=0, lr=3e-3, layers=2,
              telemetry=None, scales=None, d_model=64, parametrization="sp", steps=None,
              num_steps=None, warmup=0, failed_from=None):
  """A run directory: `telemetry` {step: {key: value}} on telemetry steps, `scales` {step: loss
  scale} (default 2^15 on every step), loss 4 - step / 1000 (NaN from `failed_from`)."""
  os.makedirs(directory, exist_ok=True)
  telemetry = telemetry or {}
  steps = steps or sorted(telemetry)
  records = []
  for step in steps:
    bad = failed_from is not None and step >= failed_from
    record = {"step": step, "loss": math.nan if bad else 4.0 - step / 1000, "skipped": bad,
              "grad_norm": 1.0, "loss_scale": (scales or {}).get(step, 2.0 ** 15)}
    record.update(telemetry.get(step, {}))
    records.append(record)
  with open(os.path.join(directory, schema.METRICS), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with open(os.path.join(directory, schema.RUN), "w", encoding="utf-8") as f:
    json.dump({"name": os.path.basename(directory), "arm": arm, "label": arm,
               "status": schema.FINISHED, "last_step": steps[-1]}, f)
  config = {"model": {"dtype": dtype, "d_model": d_model, "num_layers": layers,
                      "parametrization": parametrization},
            "optimizer": {"learning_rate": lr, "warmup_steps": warmup,
                          "loss_scale": {"kind": "dynamic", "min_scale": MIN_SCALE}},
            "train": {"seed": seed, "num_steps": num_steps or steps[-1]}}
  with open(os.path.join(directory, schema.CONFIG), "w", encoding="utf-8") as f:
    json.dump(config, f)


def _telemetry(resid, mlp, logit, output):
  """Per-layer lists -> record keys."""
  out = {"output_logit_max": output}
  for name, values in (("resid_absmax", resid), ("mlp_preact_absmax", mlp),
                       ("attn_logit_max", logit)):
    out.update({f"{name}/layer_{i}": v for i, v in enumerate(values)})
  return out


def test_each_series_is_log2_of_the_limit_over_its_largest_layer(tmp_path):
  telemetry = {10: _telemetry([3.0, 1000.0], [5.0, 2.0], [20.0, 40.0], 8.0),
               20: _telemetry([4.0, 16376.0], [70.0, 2.0], [20.0, 41.0], 9.0)}
  write_run(str(tmp_path / "r"), telemetry=telemetry, scales={10: 2.0 ** 10, 20: 2.0 ** 3},
            seed=3, lr=0.01, d_model=128, parametrization="mup")
  rows = headroom.table(runs_lib.load_runs(str(tmp_path)))
  assert list(rows.columns[:8]) == ["arm", "parametrization", "width", "depth", "step", "seed",
                                    "series", "headroom"]
  got = {(r.step, r.series): (r.headroom, r.layer) for r in rows.itertuples()}
  expected = {
      (10, "resid_absmax"): (math.log2(HALF_MAX / 1000.0), "1"),
      (10, "mlp_preact_absmax"): (math.log2(HALF_MAX / 5.0), "0"),
      (10, "attn_logit_max"): (math.log2(HALF_MAX / 40.0), "1"),
      (10, "output_logit_max"): (math.log2(HALF_MAX / 8.0), ""),
      (10, "loss_scale"): (math.log2(2.0 ** 10 / MIN_SCALE), ""),
      (20, "resid_absmax"): (math.log2(HALF_MAX / 16376.0), "1"),  # 2 bits: 65,504 / 4
      (20, "mlp_preact_absmax"): (math.log2(HALF_MAX / 70.0), "0"),
      (20, "attn_logit_max"): (math.log2(HALF_MAX / 41.0), "1"),
      (20, "output_logit_max"): (math.log2(HALF_MAX / 9.0), ""),
      (20, "loss_scale"): (math.log2(2.0 ** 3 / MIN_SCALE), ""),
  }
  for key, (value, layer) in expected.items():
    assert got[key][0] == pytest.approx(value, rel=1e-12), key
    assert got[key][1] == layer, key
  assert got[(20, "resid_absmax")][0] == pytest.approx(2.0)
  # The least: the residual stream at step 10 (5.0 bits) and 20 (2.0 bits).
  assert got[(10, "least")] == (pytest.approx(math.log2(HALF_MAX / 1000.0)), "resid_absmax")
  assert got[(20, "least")] == (pytest.approx(2.0), "resid_absmax")
  facts = rows.iloc[0]
  assert tuple(facts[["arm", "parametrization", "width", "depth", "seed", "learning_rate",
                      "dtype"]]) == ("a", "mup", 128, 2, 3, 0.01, "float16")


def test_the_loss_scale_is_least_when_its_halvings_run_out(tmp_path):
  telemetry = {10: _telemetry([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 1.0)}
  write_run(str(tmp_path / "r"), telemetry=telemetry, scales={10: 4 * MIN_SCALE},
            steps=[5, 10])
  rows = headroom.table(runs_lib.load_runs(str(tmp_path)))
  least = rows[rows.series == "least"]
  assert list(least.step) == [10]  # telemetry steps only
  assert least.headroom.iloc[0] == pytest.approx(2.0)
  assert least.layer.iloc[0] == "loss_scale"


def test_a_float32_run_has_no_loss_scale_series_and_float32s_limit(tmp_path):
  telemetry = {10: _telemetry([2.0 ** 100, 1.0], [1.0, 1.0], [1.0, 1.0], 1.0)}
  write_run(str(tmp_path / "r"), dtype="float32", telemetry=telemetry)
  rows = headroom.table(runs_lib.load_runs(str(tmp_path)))
  assert "loss_scale" not in set(rows.series)
  fp32_max = float(np.finfo(np.float32).max)
  resid = rows[rows.series == "resid_absmax"].headroom.iloc[0]
  assert resid == pytest.approx(math.log2(fp32_max) - 100, rel=1e-12)
  assert headroom.LIMITS["bfloat16"] == pytest.approx(3.3895313892515355e38, rel=1e-15)


def test_a_non_finite_value_has_no_headroom_and_the_least_skips_it(tmp_path):
  telemetry = {10: _telemetry([math.inf, math.nan], [100.0, 1.0], [1.0, 1.0], 1.0)}
  write_run(str(tmp_path / "r"), telemetry=telemetry)
  rows = headroom.table(runs_lib.load_runs(str(tmp_path)))
  got = {r.series: r.headroom for r in rows.itertuples()}
  assert math.isnan(got["resid_absmax"])
  assert got["least"] == pytest.approx(math.log2(HALF_MAX / 100.0))


def test_drift_series_decades_are_the_same_headroom_in_log10():
  values = np.array([1.0, 650.0, 65504.0, 1e5])
  decades = drift_series.headroom("resid_absmax/layer_0", values, MIN_SCALE)
  np.testing.assert_allclose(decades, np.log10(HALF_MAX / values), rtol=1e-12, atol=1e-15)
  scale = drift_series.headroom("loss_scale", np.array([1.0, 2.0 ** 15]), MIN_SCALE)
  np.testing.assert_allclose(scale, np.log10(np.array([1.0, 2.0 ** 15]) / MIN_SCALE), rtol=1e-12)

"""The ladder's statistics (normstudy.analysis.ladder_report) against scipy, the matrix form of least
squares, and simulated ladders whose power law is known."""

import dataclasses
import math
import os
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normstudy.analysis import ladder_report
from normstudy.core.experiment import Search

WIDTHS = np.array([32.0, 64.0, 128.0, 256.0])


def test_the_fit_is_least_squares_on_log_log():
  lrs = np.array([0.61, 0.35, 0.24, 0.11])
  line = ladder_report.fit(WIDTHS, lrs)
  ref = scipy_stats.linregress(np.log10(WIDTHS), np.log10(lrs))
  assert (line.slope, line.intercept) == pytest.approx((ref.slope, ref.intercept))
  half = scipy_stats.t.ppf(0.975, 2) * ref.stderr
  assert (line.slope_low, line.slope_high) == pytest.approx((ref.slope - half, ref.slope + half))
  fitted = ref.intercept + ref.slope * np.log10(WIDTHS)
  np.testing.assert_allclose(line.residuals, np.log10(lrs) - fitted, atol=1e-12)
  # The prediction interval of a new observation, from the matrix form: s^2 (1 + x0 (X'X)^-1 x0).
  X = np.column_stack([np.ones(4), np.log10(WIDTHS)])
  s2 = np.sum(np.asarray(line.residuals) ** 2) / 2
  x0 = np.array([1.0, math.log10(1024)])
  se = math.sqrt(s2 * (1 + x0 @ np.linalg.inv(X.T @ X) @ x0))
  centre = x0 @ np.linalg.lstsq(X, np.log10(lrs), rcond=None)[0]
  t = scipy_stats.t.ppf(0.975, 2)
  assert line.prediction(1024) == pytest.approx(
      (10 ** centre, 10 ** (centre - t * se), 10 ** (centre + t * se)))
  with pytest.raises(ValueError, match="two distinct sizes"):
    ladder_report.fit([64, 64], [0.1, 0.2])


def test_the_held_out_rung_is_predicted_from_the_others():
  lrs = np.array([0.61, 0.35, 0.24, 0.11])
  held = ladder_report.heldout(WIDTHS, lrs)
  predicted, low, high = ladder_report.fit(WIDTHS[:3], lrs[:3]).prediction(256)
  assert (held["predicted"], held["low"], held["high"]) == pytest.approx((predicted, low, high))
  assert held["measured"] == 0.11 and held["inside"] == (low <= 0.11 <= high)
  assert ladder_report.heldout(WIDTHS[:3], lrs[:3])["inside"] is None  # 2 rungs: no interval
  far = ladder_report.heldout(WIDTHS, np.array([0.4, 0.2, 0.1, 5.0]))
  assert far["inside"] is False and far["predicted"] == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize("noise", ["normal", "t3"])
def test_the_held_out_interval_covers_a_known_power_law(noise):
  """Simulated ladders: log10 critical lr = 0.3 - 0.7 log10 width plus noise of 0.06 decades
  per measured rung (normal, or Student t with 3 degrees of freedom: heavier tails than the
  interval assumes). The 95% prediction interval from three rungs covers the true value at the
  fourth in at least 90% of ladders, and the measured value about as often as it claims."""
  rng = np.random.default_rng(7)
  truth = 0.3 - 0.7 * np.log10(WIDTHS)
  covered_true = covered_measured = 0
  trials = 4000
  for _ in range(trials):
    e = (rng.normal(size=4) if noise == "normal" else rng.standard_t(3, size=4) / math.sqrt(3))
    measured = 10 ** (truth + 0.06 * e)
    held = ladder_report.heldout(WIDTHS, measured)
    covered_true += held["low"] <= 10 ** truth[-1] <= held["high"]
    covered_measured += bool(held["inside"])
  assert covered_true / trials >= 0.9
  if noise == "normal":  # exact under the model: 95% +- 3 standard errors
    assert abs(covered_measured / trials - 0.95) < 3 * math.sqrt(0.95 * 0.05 / trials)


def test_a_ratio_that_changes_with_size_is_the_interaction():
  a = np.array([0.40, 0.30, 0.20, 0.12])
  b = np.array([0.20, 0.17, 0.13, 0.10])
  got = ladder_report.interaction(WIDTHS, a, b)
  ref = scipy_stats.linregress(np.log10(WIDTHS), np.log10(a / b))
  assert got["slope"] == pytest.approx(ref.slope) and got["p"] == pytest.approx(ref.pvalue)
  assert got["df"] == 2
  same = ladder_report.interaction(WIDTHS, 2 * b, b)  # a constant ratio
  assert same["slope"] == pytest.approx(0, abs=1e-12) and same["p"] == pytest.approx(1.0)


def test_extrapolation_says_whether_it_is_within_the_ladder():
  lrs = 10 ** (0.3 - 0.7 * np.log10(WIDTHS))
  inside = ladder_report.predict(WIDTHS, lrs * [1.02, 0.98, 1.01, 0.99], 100)
  outside = ladder_report.predict(WIDTHS, lrs * [1.02, 0.98, 1.01, 0.99], 1024)
  assert inside["within"] and not outside["within"]
  assert outside["predicted"] == pytest.approx(10 ** (0.3 - 0.7 * math.log10(1024)), rel=0.05)
  assert outside["high"] / outside["low"] > inside["high"] / inside["low"]  # wider away


def test_the_fit_table_fits_each_ladder_on_its_own_axis():
  rows = []
  arms = {"pre_norm_clip1": (0.3, -0.7), "post_norm_deepnorm_clip1": (0.6, -0.5)}
  for arm, (a, b) in arms.items():
    for layers, width in [(4, 32), (4, 64), (4, 128), (4, 256), (8, 64), (16, 64), (24, 64)]:
      params = 12 * layers * width ** 2
      rows.append({"arm": arm, "dtype": "float16", "num_layers": layers, "d_model": width,
                   "params": params, "critical_lr": 10 ** (a + b * math.log10(params)),
                   "critical_lr_low": math.nan, "critical_lr_high": math.nan})
  table = ladder_report.fit_table(pd.DataFrame(rows, columns=ladder_report.LADDER_COLUMNS))
  assert list(table.columns) == ladder_report.FIT_COLUMNS
  got = table.set_index(["arm", "axis"])
  # Exact power laws in params: slope b in params, 2b in width (params ~ width^2), b in depth.
  assert got.loc[("pre_norm_clip1", "params"), "slope"] == pytest.approx(-0.7)
  assert got.loc[("pre_norm_clip1", "d_model"), "slope"] == pytest.approx(-1.4)
  assert got.loc[("pre_norm_clip1", "num_layers"), "slope"] == pytest.approx(-0.7)
  assert got.loc[("post_norm_deepnorm_clip1", "d_model"), "rungs"] == 4
  assert got.loc[("post_norm_deepnorm_clip1", "num_layers"), "rungs"] == 4  # 4, 8, 16, 24 at 64
  assert got.loc[("pre_norm_clip1", "params"), "heldout_measured"] == pytest.approx(
      10 ** (0.3 - 0.7 * math.log10(12 * 4 * 256 ** 2)))  # the largest: 4 x 256


def _write_rung(directory, model, found):
  """A rung as `make ladder` leaves it: a search's sweep.json, one run's config.json and the
  analysis's critical_lr.csv ({arm: critical lr})."""
  import json
  run = directory / "pre_norm_clip1" / "lr0.1_seed0"
  run.mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"model": model}))
  (directory / "sweep.json").write_text(json.dumps(
      {"runs": [{"name": "pre_norm_clip1/lr0.1_seed0"}], "search": {}}))
  pd.DataFrame([{"arm": arm, "label": arm, "group": "", "critical_lr": lr,
                 "critical_lr_low": lr / 1.2, "critical_lr_high": lr * 1.2}
                for arm, lr in found.items()]).to_csv(directory / "critical_lr.csv", index=False)


def test_the_ladder_command_collects_rungs_fits_and_extrapolates(tmp_path):
  import json
  import runs
  from configs import shakespeare
  from normstudy.engine import memory
  model = json.loads(shakespeare.base_config().model.to_json())
  truth = {"pre_norm_clip1": (0.3, -0.7), "post_norm_deepnorm_clip1": (0.5, -0.4)}
  noise = iter(np.random.default_rng(3).normal(0, 0.03, size=64))
  expected = {}
  for dtype in ("float16", "float32"):
    for width in WIDTHS.astype(int):
      rung = dict(model, d_model=int(width), d_ff=4 * int(width), dtype=dtype)
      found = {arm: 10 ** (a + b * math.log10(width) + next(noise))
               for arm, (a, b) in truth.items()}
      expected[(dtype, width)] = found
      _write_rung(tmp_path / dtype / f"width{width}", rung, found)
  result = runs.run_inline("normstudy.ladder", f"--workdir={tmp_path}")
  assert "ladder_fit:" in result.stdout
  table = pd.read_csv(tmp_path / "ladder.csv")
  assert list(table.columns) == ladder_report.LADDER_COLUMNS and len(table) == 16
  row = table[(table.arm == "pre_norm_clip1") & (table.dtype == "float32")
              & (table.d_model == 128)].iloc[0]
  assert row.critical_lr == pytest.approx(expected[("float32", 128)]["pre_norm_clip1"])
  assert row.params == memory.parameter_count(
      shakespeare.base_config().model.__class__(dict(model, d_model=128, d_ff=512)))
  fits = pd.read_csv(tmp_path / "ladder_fit.csv").set_index(["arm", "dtype", "axis"])
  got = fits.loc[("post_norm_deepnorm_clip1", "float16", "d_model")]
  lrs = [expected[("float16", w)]["post_norm_deepnorm_clip1"] for w in WIDTHS.astype(int)]
  assert got.slope == pytest.approx(np.polyfit(np.log10(WIDTHS), np.log10(lrs), 1)[0])
  assert got.heldout_measured == pytest.approx(lrs[-1])
  assert got.target == 1024 and got.extrapolation == "beyond the ladder: a trend check"
  assert got.extrapolated == pytest.approx(10 ** (got.intercept + got.slope * math.log10(1024)))
  tests = pd.read_csv(tmp_path / "ladder_tests.csv")
  pair = tests[(tests.dtype == "float16") & (tests.axis == "d_model")].iloc[0]
  pre = [expected[("float16", w)]["pre_norm_clip1"] for w in WIDTHS.astype(int)]
  ratio = np.array(pre) / np.array(lrs)
  if pair.arm_a != "pre_norm_clip1":
    ratio = 1 / ratio
  ref = scipy_stats.linregress(np.log10(WIDTHS), np.log10(ratio))
  # The scatter: the residual SD, floored by both rungs' measurement SD (their +-1.2x intervals).
  x = np.log10(WIDTHS)
  residual = np.log10(ratio) - (ref.intercept + ref.slope * x)
  own = math.sqrt(2) * math.log10(1.2 * 1.2) / (2 * scipy_stats.norm.ppf(0.975))
  sd = max(math.sqrt(np.sum(residual ** 2) / 2), own)
  t = ref.slope / (sd / math.sqrt(np.sum((x - x.mean()) ** 2)))
  assert pair.p == pytest.approx(2 * scipy_stats.t.sf(abs(t), 2))
  assert pair.slope == pytest.approx(ref.slope)
  assert os.path.exists(tmp_path / "ladder.png")
  empty = tmp_path / "empty"
  empty.mkdir()
  refused = runs.run_inline("normstudy.ladder", f"--workdir={empty}", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
  assert "holds no analysed search" in refused.stderr


def test_the_ladder_file_plans_one_search_per_rung_and_dtype():
  from configs import ladder as ladder_config
  from normstudy.experiments import grid
  from normstudy.experiments import ladder_runs as experiment
  declared = grid.load_experiment("configs/ladder.py")
  rungs = experiment.plan_rungs("configs/ladder.py", declared)
  assert len(rungs) == len(ladder_config.LADDER_RUNGS) * len(ladder_config.LADDER_DTYPES)
  assert len({r.directory for r in rungs}) == len(rungs)
  wide = next(r for r in rungs if (r.dtype, r.num_layers, r.d_model) == ("float32", 4, 128))
  assert wide.directory == os.path.join("float32", "L4_d128")
  search = ladder_config.LADDER_SEARCH
  assert wide.argv == (
      "--config=configs/ladder.py",
      f"--search=optimizer.learning_rate:{search.low:g},{search.high:g}",
      f"--rounds={search.rounds}", f"--probe_decades={search.probe_decades:g}",
      "--config.model.dtype=float32", "--config.model.num_layers=4",
      "--config.model.d_model=128", "--config.model.d_ff=512", "--config.model.num_heads=8")
  only = experiment.plan_rungs("configs/ladder.py", declared, ["float16"])
  assert {r.dtype for r in only} == {"float16"}


@pytest.mark.parametrize("field, value, message", [
    ("rungs", [(4, 32), (4, 32)], "list a rung twice"),
    ("rungs", [(4, 0)], "rungs=[(4, 0)] is not allowed"),
    ("dtypes", ("float8",), "dtypes=('float8',) is not allowed"),
    ("search", Search("optimizer.learning_rate", 3, 1, rounds=3), "allowed: 0 < LOW < HIGH"),
    ("rung_overrides", None, "does not declare rung_overrides"),
    ("learning_rates", (0.1, 1.0), "exactly one of search and learning_rates"),
])
def test_a_wrong_ladder_file_is_refused_in_one_line(field, value, message):
  import dataclasses
  from normstudy.errors import UserError
  from normstudy.experiments import grid
  from normstudy.experiments import ladder_runs as experiment
  declared = grid.load_experiment("configs/ladder.py")
  declared = dataclasses.replace(declared, ladder=dataclasses.replace(declared.ladder,
                                                                      **{field: value}))
  with pytest.raises(UserError, match=re.escape(message)):
    experiment.plan_rungs("configs/ladder.py", declared)
  with pytest.raises(UserError, match="is not a ladder: its EXPERIMENT declares no ladder"):
    experiment.plan_rungs("configs/survival.py", grid.load_experiment("configs/survival.py"))


@pytest.mark.slow
def test_the_ladder_command_refuses_a_dtype_its_file_does_not_declare(tmp_path):
  import runs
  refused = runs.run_module("normstudy.ladder", "--config=configs/ladder.py",
                            f"--workdir={tmp_path / 'ladder'}", "--dtypes=bfloat16", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
  assert "bfloat16 is not among configs/ladder.py's Ladder's dtypes" in refused.stderr
  assert not (tmp_path / "ladder").exists()


def test_the_gpu_ladder_continues_the_cpu_ladder_at_larger_rungs():
  from configs import ladder as cpu
  from configs import ladder_gpu as gpu
  from normstudy.experiments import grid
  from normstudy.experiments import ladder_runs as experiment
  rungs = experiment.plan_rungs("configs/ladder_gpu.py",
                                grid.load_experiment("configs/ladder_gpu.py"))
  assert max((r.num_layers, r.d_model) for r in rungs) == (24, 1024)  # MERT's shape
  assert not {(r.num_layers, r.d_model) for r in rungs} & set(cpu.LADDER_RUNGS)
  def without_rungs(declared):
    return dataclasses.replace(declared, ladder=dataclasses.replace(declared.ladder, rungs=()))
  assert without_rungs(gpu.EXPERIMENT) == without_rungs(cpu.EXPERIMENT)  # only the rungs differ
  assert gpu.get_config("pre_norm_clip1").to_dict() == cpu.get_config("pre_norm_clip1").to_dict()


def test_rungs_exactly_on_a_line_keep_their_own_measurement_error():
  """A search quantises its estimates, so rungs can lie exactly on a line: the intervals then use
  the rungs' own standard errors (from their 95% intervals), not a residual SD of 0."""
  lrs = 0.5 * (WIDTHS / 32) ** -0.5  # exactly a power law
  lows, highs = lrs / 1.5, lrs * 1.5
  own = ladder_report.measurement_sd(lows, highs)
  np.testing.assert_allclose(own, np.log10(1.5) / scipy_stats.norm.ppf(0.975))
  bare = ladder_report.fit(WIDTHS, lrs)
  assert bare.residual_sd == pytest.approx(0, abs=1e-12)
  floored = ladder_report.fit(WIDTHS, lrs, own)
  assert floored.sd == pytest.approx(own[0]) and floored.residual_sd == bare.residual_sd
  x = np.log10(WIDTHS)
  half = scipy_stats.t.ppf(0.975, 2) * own[0] / math.sqrt(np.sum((x - x.mean()) ** 2))
  assert (floored.slope_low, floored.slope_high) == pytest.approx((-0.5 - half, -0.5 + half))
  held = ladder_report.heldout(WIDTHS, lrs, own)
  assert held["low"] < held["measured"] < held["high"] and held["inside"]
  # The residual SD wins where it is the larger.
  noisy = lrs * 10 ** np.array([0.2, -0.2, 0.2, -0.2])
  assert ladder_report.fit(WIDTHS, noisy, own).sd == ladder_report.fit(WIDTHS, noisy).residual_sd


def test_the_held_out_rung_says_what_a_flat_law_would_have_predicted():
  # A flat law: the other rungs' mean log10 rate with the t prediction interval of a new
  # observation, sd * sqrt(1 + 1/n) * t(0.975, n - 1), computed here by hand.
  sizes = np.array([16, 32, 64, 128])
  lrs = np.array([0.30, 0.21, 0.16, 0.10])
  got = ladder_report.heldout(sizes, lrs)
  logs = np.log10(lrs[:3])
  half = scipy_stats.t.ppf(0.975, 2) * logs.std(ddof=1) * math.sqrt(1 + 1 / 3)
  assert got["flat_predicted"] == pytest.approx(10 ** logs.mean())
  assert (got["flat_low"], got["flat_high"]) == (pytest.approx(10 ** (logs.mean() - half)),
                                                 pytest.approx(10 ** (logs.mean() + half)))
  assert got["flat_inside"] == (got["flat_low"] <= 0.10 <= got["flat_high"])
  # Why the check matters: on 4 evenly spaced rungs a noise-free line of any slope leaves its
  # largest rung 2 steps from the others' mean, inside the flat law's t(0.975, 2) x 1 step x
  # sqrt(4/3) = 4.97 steps: the flat law passes every such held-out test too.
  for slope in (-0.3, -1.0, -3.0):
    line = ladder_report.heldout(sizes, 10 ** (-0.5 + slope * np.log10(sizes / 16)))
    assert line["flat_inside"]


def test_the_ladder_says_how_often_each_arm_clipped_at_each_rung(tmp_path):
  """ladder_clip.csv: per rung and arm, the mean of runs.csv's clipped_fraction over every probe
  and over the probes that did not fail (issue 85: a clip that acts on most of one
  parametrization's steps and on none of another's is a second difference between them)."""
  import json
  import runs
  from configs import shakespeare
  model = json.loads(shakespeare.base_config().model.to_json())
  rng = np.random.default_rng(5)
  expected = {}
  for width in (32, 64, 128):
    directory = tmp_path / "float16" / f"width{width}"
    _write_rung(directory, dict(model, d_model=width, d_ff=4 * width, dtype="float16"),
                {"pre_norm_clip1": 0.3})
    config = json.loads((directory / "pre_norm_clip1" / "lr0.1_seed0" / "config.json").read_text())
    config["optimizer"] = {"clip_norm": 1.0}
    (directory / "pre_norm_clip1" / "lr0.1_seed0" / "config.json").write_text(json.dumps(config))
    (directory / "sweep.json").write_text(json.dumps(
        {"runs": [{"name": "pre_norm_clip1/lr0.1_seed0", "arm": "pre_norm_clip1"}],
         "search": {}}))
    fractions = rng.uniform(0, 1, size=6).round(4)
    failed = [None, 40, None, None, 7, None]
    pd.DataFrame({"run": [f"r{i}" for i in range(6)], "arm": "pre_norm_clip1",
                  "learning_rate": np.geomspace(0.03, 3, 6), "clipped_fraction": fractions,
                  "failed_at": failed}).to_csv(directory / "runs.csv", index=False)
    alive = [f for f, at in zip(fractions, failed) if at is None]
    expected[width] = (sum(fractions) / 6, sum(alive) / len(alive), len(alive))
  runs.run_inline("normstudy.ladder", f"--workdir={tmp_path}")
  table = pd.read_csv(tmp_path / "ladder_clip.csv")
  assert tuple(table.columns) == ladder_report.schema.LADDER_CLIP_COLUMNS
  assert sorted(table.d_model) == [32, 64, 128]
  for row in table.itertuples():
    everyone, survivors, count = expected[row.d_model]
    assert row.clip_norm == 1.0 and row.runs == 6 and row.alive == count
    assert row.clipped_fraction == pytest.approx(everyone)
    assert row.clipped_fraction_alive == pytest.approx(survivors)


def test_an_analysed_search_without_its_runs_is_refused_in_one_line(tmp_path):
  """Issue 88, item 3: `normstudy.ladder --workdir=docs/survival` (a search whose tables alone
  were committed) was a KeyError traceback; it is one line naming the missing config.json."""
  import runs
  result = runs.run_module("normstudy.ladder", "--workdir=docs/survival", check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1500:]
  assert result.stderr.strip().splitlines() == [
      "error: docs/survival holds an analysed search but not its runs "
      "(docs/survival/pre_norm_clip1/lr0.1_seed0/config.json is missing): normstudy.ladder reads "
      "each rung's model from its runs; give it a ladder's workdir as `make ladder` trains it"]


def test_the_ladder_eta_fits_the_rungs_trained_here_not_the_ones_finished_earlier():
  """A resumed ladder said "411s so far | ETA 1607s" with 8 hours left: the rungs finished
  earlier (seconds each) entered its mean, and a 4 x 16 rung counted as much as a 4 x 512. The
  ETA fits seconds = a + b x layers x width^2 to the rungs trained in this invocation (numpy's
  least-squares line here), their mean while all are one size, none before one."""
  import numpy as np
  from normstudy.experiments import ladder_runs
  assert ladder_runs.rungs_eta([], [1.0, 2.0]) is None
  assert ladder_runs.rungs_eta([(4.0, 10.0), (4.0, 20.0)], [4.0, 8.0, 16.0]) == 45.0
  sizes = [4 * 16**2, 4 * 32**2, 4 * 64**2, 4 * 128**2]
  seconds = [200.0, 260.0, 420.0, 1100.0]
  left = [4 * 256**2, 4 * 512**2]
  b, a = np.polyfit(sizes, seconds, 1)
  eta = ladder_runs.rungs_eta(list(zip(sizes, seconds)), left)
  assert eta == pytest.approx(sum(a + b * x for x in left))
  mean_eta = sum(seconds) / len(seconds) * len(left)  # the old estimate: 990 s
  assert eta > 10 * mean_eta  # the two big rungs dominate what is left


def test_train_rungs_says_which_rungs_finished_earlier_and_leaves_them_out_of_its_eta(
    tmp_path, monkeypatch):
  """train_rungs over a resumed ladder: the rung whose search finished earlier is said so and
  its seconds leave the ETA out; each rung is one normstudy.sweep command of its own."""
  from normstudy.experiments import ladder_runs
  from normstudy.records import schema
  rungs = [ladder_runs.Rung("float32", 4, d, f"float32/L4_d{d}", ("--config=c.py",))
           for d in (16, 32, 64)]
  (tmp_path / "float32" / "L4_d16").mkdir(parents=True)
  (tmp_path / "float32" / "L4_d16" / schema.CRITICAL_LR).write_text("arm\n")
  commands = []
  monkeypatch.setattr(ladder_runs.workers_lib, "run_commands",
                      lambda argvs: commands.extend(argvs) or [0] * len(argvs))
  lines = []
  ladder_runs.train_rungs(rungs, str(tmp_path), log=lines.append)
  assert [c[-1] for c in commands] == [f"--workdir={tmp_path / r.directory}" for r in rungs]
  assert lines[0].endswith("(finished earlier)") and not lines[2].endswith("(finished earlier)")
  assert lines[1].endswith("ETA after a rung trained here (the ones done were finished earlier)")
  assert "ETA 0s (the rungs left by a fit of the 2 trained here" in lines[-1]

"""normstudy.forecast: the headroom trend and its crossing on simulated series whose crossing is
known in closed form, the interval's coverage of the simulated continuation's first passage,
Harrell's concordance by hand, and the command on fabricated runs."""

import math
import os

import numpy as np
import pandas as pd
import pytest

from normstudy import forecast as forecast_cli
from normstudy.analysis import headroom_trend as forecast
from normstudy.analysis import stats
from tests import runs as cli_runs
from tests.test_headroom import HALF_MAX
from tests.test_headroom import write_run


def _ar1(rng, n, sigma, phi=0.5):
  noise = np.empty(n)
  noise[0] = rng.normal(0, sigma)
  for i in range(1, n):
    noise[i] = phi * noise[i - 1] + rng.normal(0, sigma * math.sqrt(1 - phi ** 2))
  return noise


def test_a_power_law_drift_crosses_where_its_closed_form_says():
  # h = 16 - 1.25 log2(step): 0 at step 2^(16 / 1.25) = 2^12.8 = 7,131.
  rng = np.random.default_rng(0)
  steps = np.arange(50, 2001, 50)
  truth = 2 ** (16 / 1.25)
  h = 16 - 1.25 * np.log2(steps) + _ar1(rng, len(steps), 0.05)
  made = forecast.fit(steps, h, "resid_absmax", "log_step")
  assert made.crossing == pytest.approx(truth, rel=0.1)
  assert made.early < truth < made.late
  assert made.rate == pytest.approx(-1.25, abs=0.05)  # bits per doubling
  assert made.rate_low < -1.25 < made.rate_high
  assert made.now == 2000 and made.points == len(steps)


def test_an_exponential_drift_crosses_where_its_closed_form_says():
  # h = 10 - 0.002 step: 0 at step 5,000; rate -2 bits per 1000 steps.
  rng = np.random.default_rng(1)
  steps = np.arange(20, 2001, 20)
  h = 10 - 0.002 * steps + _ar1(rng, len(steps), 0.05)
  made = forecast.fit(steps, h, "mlp_preact_absmax", "step")
  assert made.crossing == pytest.approx(5000, rel=0.05)
  assert made.early < 5000 < made.late
  assert made.rate == pytest.approx(-2.0, abs=0.1)


def test_a_flat_or_rising_series_never_crosses():
  rng = np.random.default_rng(2)
  steps = np.arange(10, 1001, 10)
  flat = forecast.fit(steps, 12 + _ar1(rng, len(steps), 0.05), "x", "log_step")
  assert math.isinf(flat.crossing) and math.isinf(flat.late)
  rising = forecast.fit(steps, 12 + 0.001 * steps, "x", "step")
  assert rising.rate > 0 and math.isinf(rising.crossing) and math.isinf(rising.early)
  assert forecast.fit(steps[:5], np.ones(5)) is None  # too few points


@pytest.mark.slow
def test_the_interval_holds_the_first_passage_of_the_continued_series():
  """100 simulated runs (AR(1) noise, slopes, starts and scatter drawn; the crossing after the
  seen steps): fitted on steps up to 1000, the 95% interval holds the step where the continued
  noisy series first reaches 0 in at least 88 (the nominal 95, less the binomial spread), and
  is not the whole line."""
  rng = np.random.default_rng(3)
  inside, finite = 0, 0
  for _ in range(100):
    start, k, sigma = rng.uniform(12, 15), rng.uniform(0.7, 1.1), rng.uniform(0.03, 0.2)
    steps = np.arange(25, 2_000_001, 25)
    h = start - k * np.log2(steps) + _ar1(rng, len(steps), sigma)
    seen = steps <= 1000
    made = forecast.fit(steps[seen], h[seen], "x", "log_step", draws=500)
    later = np.nonzero((h <= 0) & ~seen)[0]
    passage = steps[later[0]] if len(later) else math.inf
    inside += made.early <= passage <= made.late
    finite += math.isfinite(made.late)
  assert inside >= 88
  assert finite >= 80


@pytest.mark.parametrize("predicted, time, event, expected", [
    ([1, 2, 3], [10, 20, 30], [1, 1, 1], 1.0),
    ([3, 2, 1], [10, 20, 30], [1, 1, 1], 0.0),
    ([1, 1, 1], [10, 20, 30], [1, 1, 1], 0.5),
    # Pairs known: (0,1), (0,2) (0 failed first); 1 is censored before 2, unknown. 0 before 1:
    # concordant; 0 after 2: discordant.
    ([5, 9, 2], [10, 20, 30], [1, 0, 0], 0.5),
    ([1, 2], [10, 20], [0, 0], math.nan),
])
def test_concordance_by_hand(predicted, time, event, expected):
  got = stats.concordance(predicted, time, event)
  assert (math.isnan(got) and math.isnan(expected)) or got == expected


def _drifting_run(directory, *, start, k, num_steps, seed=0, warmup=50, every=25):
  """A float16 run whose last layer's residual absmax is start x step^k (h = log2(65,504 /
  start) - k log2 step): it fails where that passes 65,504, if before num_steps."""
  rng = np.random.default_rng(seed)
  crossing = (HALF_MAX / start) ** (1 / k)
  steps = list(range(every, num_steps + 1, every))
  noise = _ar1(rng, len(steps), 0.02)
  telemetry = {}
  failed_from = None
  for i, step in enumerate(steps):
    value = start * step ** k * 2 ** noise[i]
    if value > HALF_MAX and failed_from is None:
      failed_from = step
    if failed_from is None:
      telemetry[step] = {"resid_absmax/layer_0": 1.0, "resid_absmax/layer_1": value,
                         "mlp_preact_absmax/layer_0": 3.0, "mlp_preact_absmax/layer_1": 3.0,
                         "attn_logit_max/layer_0": 2.0, "attn_logit_max/layer_1": 2.0,
                         "output_logit_max": 5.0}
  write_run(directory, telemetry=telemetry, steps=steps, num_steps=num_steps, warmup=warmup,
            failed_from=failed_from, seed=seed)
  return crossing, failed_from


def test_the_command_prints_each_series_and_the_first_crossing(tmp_path):
  run = str(tmp_path / "run")
  crossing, failed = _drifting_run(run, start=2.0, k=1.25, num_steps=2000)
  assert failed is None and 3000 < crossing < 5000  # alive at its end, crossing after it
  out = cli_runs.run_module("normstudy.forecast", f"--workdir={run}",
                            f"--out={tmp_path / 'out'}").stdout
  assert "resid_absmax" in out and "mlp_preact_absmax" in out and "loss_scale" in out
  line = next(l for l in out.splitlines() if "first to reach 0" in l)
  step = float(line.split(" at step ")[1].split()[0].replace(",", ""))
  assert step == pytest.approx(crossing, rel=0.1)
  assert line.split()[4] == "resid_absmax"
  table = pd.read_csv(tmp_path / "out" / "forecast.csv")  # the same forecasts, read back
  row = table[table.series == "resid_absmax"].iloc[0]
  assert row.crossing == pytest.approx(step, abs=1) and row.run == run
  assert set(table.series) == {"resid_absmax", "mlp_preact_absmax", "attn_logit_max",
                               "output_logit_max", "loss_scale"}


@pytest.mark.parametrize("args, words", [
    (("--workdir={tmp}/missing",), "is not a directory"),
    (("--workdir={tmp}", "--since=-1"), "--since=-1 is not allowed"),
    (("--workdir={tmp}", "--out={tmp}/f"), "is a file"),
    (("--workdir={tmp}", "--out=gs://b/x"), "allowed: a local directory"),
    (("--workdir={tmp}", "--trend=cubic"), "--trend"),
    (("--workdir={tmp}",), "holds no run"),
])
def test_bad_input_is_one_line(tmp_path, args, words):
  (tmp_path / "f").write_text("")
  result = cli_runs.run_module("normstudy.forecast", *(a.format(tmp=tmp_path) for a in args),
                               check=False)
  assert result.returncode != 0
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and words in lines[0], result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_validation_ranks_runs_by_when_they_fail(tmp_path):
  """Six runs drifting at different powers, in two directories pooled by a repeated --workdir:
  the three fastest fail before their 2000 steps, the rest survive; forecasts from a quarter
  and a half of each run order them (C = 1), and the tables are written and read back."""
  truth = {}
  # Crossings (65,504 / 0.05)^(1/k): 1,144, 1,380, 1,650; 6,600, 11,900, 23,400.
  for seed, k in enumerate((2.0, 1.95, 1.9, 1.6, 1.5, 1.4)):
    truth[seed] = _drifting_run(str(tmp_path / f"runs{seed % 2}" / f"k{k}"), start=0.05, k=k,
                                num_steps=2000, seed=seed)
  assert sum(failed is not None for _, failed in truth.values()) == 3
  out_dir = tmp_path / "out"
  result = cli_runs.run_module("normstudy.forecast", f"--workdir={tmp_path / 'runs0'}",
                               f"--workdir={tmp_path / 'runs1'}", "--validate",
                               f"--out={out_dir}")
  assert "6 runs (3 failed)" in result.stdout
  table = pd.read_csv(out_dir / "forecast_validation.csv")
  assert list(table.columns) == list(forecast.VALIDATION_COLUMNS)
  power = table[(table.trend == "log_step") & (table.fraction >= 0.25)]
  assert len(power) == 2 and (power.runs == 6).all() and (power.failed == 3).all()
  assert (power.c_index == 1.0).all()
  assert (power.call_right == 1.0).all()
  made = pd.read_csv(out_dir / "forecasts.csv")
  assert set(made.trend) == set(forecast.TRENDS) and set(made.fraction) == {0.1, 0.25, 0.5}


def test_the_commands_trends_are_the_librarys():
  assert forecast_cli.TRENDS == forecast.TRENDS
  assert os.path.basename(forecast_cli.__file__) == "forecast.py"

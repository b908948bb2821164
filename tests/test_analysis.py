"""The analysis on synthetic trajectories with known events: detectors, the summary, the prose,
and the figures of halted runs."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from normstudy import analysis
from normstudy.analysis import plots
from normstudy.records import outcomes
from normstudy.records import schema


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


def test_spike_detector_sees_a_spike_in_the_first_logged_steps():
  loss = pd.Series([5.5, 5.4, 5.35, 5.3, 5.28, 5.25, 5.2, 20.8, 5.1, 5.0], index=range(1, 11))
  events = analysis.spikes(loss)
  assert [e["step"] for e in events] == [8]
  # Trend = median of the 7 earlier points (5.3); the excursion is 20.8 - 5.3.
  assert events[0]["excursion"] == pytest.approx(15.5)
  assert analysis.spikes(loss.iloc[:3]) == []  # fewer than 3 earlier points: no trend yet


def _diverged_at(loss: pd.Series, warmup_steps: int):
  """The failure rule's divergence step of a finished run's loss (normstudy.records.outcomes)."""
  ended = outcomes.judge(loss.index.to_numpy(), loss.to_numpy(), [False] * len(loss), {},
                         schema.RunInfo(status="finished"), warmup_steps)
  return ended.failed_at if ended.failed else None


def test_divergence_and_scale_collapse():
  loss = _trajectory(diverge_at=400)
  assert _diverged_at(loss, warmup_steps=10) == 400
  assert _diverged_at(_trajectory(), warmup_steps=10) is None
  rising = pd.Series([3.0, 2.0, 2.5] + [3.5, 3.2, 4.0] * 4, index=range(1, 16))
  assert _diverged_at(rising, warmup_steps=2) == 4  # above 3.0 from step 4 on, 12 steps
  assert _diverged_at(rising.iloc[:6], warmup_steps=2) is None  # 3 steps: not yet a divergence
  recovered = pd.Series([3.0, 2.0, 6.5, 2.1, 2.0], index=range(1, 6))
  assert _diverged_at(recovered, warmup_steps=1) is None  # a spike, not divergence
  scale = pd.Series([128, 256, 128, 64, 64, 128, 32, 64], index=range(1, 9), dtype=float)
  seen = analysis.scale_collapses(scale)
  assert seen["scale_halvings"] == 3 and seen["lowest_scale"] == 32
  assert seen["lowest_scale_step"] == 7
  assert seen["halvings_per_1k"] == pytest.approx(3 / 8 * 1000)


def _write_run(path, label, loss, scale, telemetry_layers=0, info=None):
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
          for j in range(2):  # per-head logits, the largest of each head at the last step
            record[f"attn_logit_max/layer_{i}/head_{j}"] = float(i + step / 100) - j
      f.write(json.dumps(record) + "\n")
  (path / "config.json").write_text(json.dumps({"label": label, "optimizer": {
      "warmup_steps": 10}}))
  (path / "run.json").write_text(json.dumps({"label": label, "status": "finished",
                                             **(info or {})}))


def test_observations_and_layer_figures_from_the_data(tmp_path, monkeypatch):
  monkeypatch.setenv(schema.FIGURE_FORMATS_ENV, "svg")  # the suite's default: PNG alone (conftest)
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
  assert list(summary.status) == ["finished", "finished"]
  text = (tmp_path / "observations.md").read_text()
  assert "Loss spiked 3 times, first at step 200" in text
  assert "fell as low as 2^3 at step 401" in text
  assert "No loss spikes." in text
  assert "Most loss spikes (3): Spiky; fewest (0): Calm." in text
  assert "The largest attention logit was 8.0 (layer 2, step 600)" in text
  for metric in ("attn_logit_max", "act_rms", "grad_norm"):
    assert (tmp_path / f"layers_{metric}.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / f"layers_{metric}.svg").read_text().lstrip().startswith("<?xml")
    assert outputs[f"layers_{metric}"].endswith(".png")
  assert (tmp_path / "loss_comparison.svg").exists()
  loaded = analysis.load_runs(str(tmp_path))
  table = analysis.layer_values(loaded, "a", "act_rms")
  assert table.shape == (3, 60) and list(table.iloc[:, 0]) == [1.0, 2.0, 3.0]
  heads = loaded.head_values("a", "attn_logit_max")
  assert heads.shape == (6, 60) and heads.loc[(2, 1)].max() == 2 + 600 / 100 - 1
  assert loaded.head_values("b", "attn_logit_max").empty  # no telemetry: no heads figure panel
  assert outputs["heads_attn_logit_max"].endswith(".png")
  assert (tmp_path / "heads_attn_logit_max.png").read_bytes().startswith(b"\x89PNG")


def test_halted_and_diverged_runs_are_kept_and_shown(tmp_path):
  finished = _trajectory(steps=100, seed=1).to_list()
  halted = _trajectory(steps=65, seed=2).to_list()
  halted[-1] = float("nan")  # the halting step's loss
  diverged = _trajectory(steps=100, seed=3).to_list()
  diverged[70:] = [float("inf")] * 30
  _write_run(tmp_path / "ok", "Fine", finished, [2.0**10] * 100)
  _write_run(tmp_path / "dead", "Dies", halted, [2.0**10] * 65, info={
      "status": "halted", "halt_step": 65, "halt_reason": "non-finite gradient",
      "nonfinite_at": "layer 3 residual stream"})
  _write_run(tmp_path / "nan", "Blows up", diverged, [2.0**10] * 100)
  df = analysis.load_runs(str(tmp_path))
  assert np.isnan(analysis.series(df, "dead", "loss").loc[65])  # NaN kept, not dropped
  summary = analysis.summarize(df).set_index("run")
  assert summary.loc["dead", "status"] == "halted"
  assert summary.loc["dead", "halt_step"] == 65
  assert summary.loc["dead", "halt_reason"] == "non-finite gradient"
  assert summary.loc["dead", "steps"] == 64  # the halting step's update was never applied
  assert summary.loc["nan", "status"] == "diverged" and summary.loc["nan", "diverged_at"] == 71
  assert summary.loc["ok", "status"] == "finished"
  text = analysis.write_observations(df, analysis.summarize(df), str(tmp_path / "obs.md"))
  text = open(text).read()
  assert ("Trained 64 steps, then halted at step 65: non-finite gradient (first non-finite: "
          "layer 3 residual stream)") in text
  assert "Halted: Dies at step 65 (non-finite gradient, first non-finite: layer 3 residual " \
         "stream)." in text
  assert "Diverged: Blows up." in text

  fig = plots.comparison_figure(df, smoothing=0.0)
  loss_ax = fig.axes[0]
  ends = [(line.get_xdata()[0], line.get_ydata()[0]) for line in loss_ax.get_lines()
          if line.get_marker() == "X"]
  assert sorted(ends) == sorted([(64, halted[63]), (70, diverged[69])])
  assert len(fig.axes) == 2  # float16 runs: a loss-scale panel


def test_no_loss_scale_panel_without_float16(tmp_path):
  _write_run(tmp_path / "a", "A", _trajectory(steps=50).to_list(), [1.0] * 50)
  fig = plots.comparison_figure(analysis.load_runs(str(tmp_path)))
  assert len(fig.axes) == 1


def test_runs_sharing_a_label_get_distinct_legend_entries(tmp_path):
  _write_run(tmp_path / "x", "Same", _trajectory(steps=20).to_list(), [1.0] * 20)
  _write_run(tmp_path / "y", "Same", _trajectory(steps=20, seed=1).to_list(), [1.0] * 20)
  loaded = analysis.load_runs(str(tmp_path))
  df = loaded.table
  assert sorted(df.label.unique()) == ["Same (x)", "Same (y)"]
  legend = [t.get_text() for t in plots.comparison_figure(loaded).axes[0].get_legend().get_texts()]
  assert "Same (x)" in legend and "Same (y)" in legend


def test_torn_and_damaged_lines(tmp_path, caplog):
  run = tmp_path / "run"
  run.mkdir()
  good = [{"step": 1, "loss": 2.0, "loss_scale": 1.0}, {"step": 2, "loss": 1.5, "loss_scale": 1.0}]
  text = "".join(json.dumps(r) + "\n" for r in good) + '{"step": 3, "loss": 1.'
  (run / "metrics.jsonl").write_text(text)
  df = analysis.load_runs(str(tmp_path))
  assert list(analysis.series(df, "run", "loss")) == [2.0, 1.5]
  assert any("torn last line" in r.getMessage() for r in caplog.records)
  (run / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\nnot json\n{"step": 3, "loss": 1.0}\n')
  df = analysis.load_runs(str(tmp_path))  # the analysis skips a damaged line, naming it
  assert list(analysis.series(df, "run", "loss").index) == [1, 3]
  assert any("metrics.jsonl:2: skipping a damaged line" in r.getMessage() for r in caplog.records)


def test_min_loss_scale_is_the_lowest_after_the_scale_first_fell():
  from normstudy.analysis import detectors
  # A climb from 128 to 2^16, then overflows: the level they drove it to, not the climb's 256.
  climbed = pd.Series([128.0, 256.0, 512.0, 65536.0, 32768.0, 65536.0, 16384.0, 32768.0])
  assert detectors.lowest_scale_after_first_fall(climbed) == 16384.0
  fell = pd.Series([128.0, 64.0, 32.0, 64.0], index=[1, 2, 3, 4])
  assert detectors.lowest_scale_after_first_fall(fell) == 32.0
  never = pd.Series([128.0, 256.0, 512.0])
  assert detectors.lowest_scale_after_first_fall(never) == 128.0  # never fell: the lowest
  assert np.isnan(detectors.lowest_scale_after_first_fall(pd.Series([], dtype=float)))


def test_ties_in_the_comparison_are_named_as_ties():
  from normstudy.analysis import report
  summary = pd.DataFrame({
      "label": ["relax", "deepnorm", "clip10"], "status": ["finished"] * 3,
      "final_eval_loss": [2.6, 2.1, 2.9],
      "loss_spikes": [0, 0, 1], "scale_halvings": [9, 9, 8],
      "final_loss_scale": [32768.0, 32768.0, 65536.0], "clipped_fraction": [0.9, 0.98, 0.01],
      "halt_step": [np.nan] * 3, "halt_reason": [None] * 3, "nonfinite_at": [None] * 3})
  text = report.compare_runs(summary)
  assert "Most loss-scale halvings (9): relax and deepnorm, tied;" in text
  assert "lowest final loss scale (2^15): relax and deepnorm, tied." in text
  summary["final_loss_scale"] = 2.0 ** 15
  assert "lowest final loss scale (2^15): every run, tied." in report.compare_runs(summary)
  summary["scale_halvings"] = [9, 8, 7]
  assert "Most loss-scale halvings (9): relax;" in report.compare_runs(summary)


def test_progress_eta_is_the_steady_state_not_the_compiling_interval(monkeypatch, caplog):
  import logging
  from types import SimpleNamespace
  from normstudy.engine import recorder
  clock = iter([0.0,            # start
                100.0,          # step 10: compiling took 100 s
                101.0, 102.0,   # steps 20, 30: 0.1 s a step
                112.0,          # step 40: a telemetry step compiled (10 s)
                113.0])         # step 50
  monkeypatch.setattr(recorder.time, "perf_counter", lambda: next(clock))
  progress = recorder.Progress([SimpleNamespace(name="a")], 0, 200, tag="[program 2/3]")
  caplog.set_level(logging.INFO)
  for step in (10, 20, 30, 40, 50):
    progress.report(step, {"a": 3.0}, {})
  lines = [r.getMessage() for r in caplog.records if "step " in r.getMessage()]
  assert all(line.startswith("[program 2/3] | step ") for line in lines)
  assert "ETA after the first interval" in lines[0]  # 100 s of compiling is no rate
  assert "10.00 steps/s | ETA 18s" in lines[1]  # (200 - 20) steps at 0.1 s
  # The median of the steady intervals (0.1, 0.1, 1.0, 0.1 s a step): the compile is ignored.
  assert "10.00 steps/s | ETA 15s" in lines[4]


def test_the_first_eta_comes_a_tenth_of_an_interval_after_the_compile(monkeypatch, caplog):
  """Issue 88, item 17: a 2000-step program's first ETA came at step 200 (lines every 100
  steps, the first interval holding the compile). Now a line at step 1 (the compile), the
  first rate and ETA 10 steps later, then every 100 steps as before."""
  import logging
  from types import SimpleNamespace
  from normstudy.engine import recorder
  at = [0]  # the step being reported: step 1 compiled for 60 s, then 0.1 s a step
  reported = []

  def perf_counter():
    return 0.0 if at[0] == 0 else 60.0 + 0.1 * (at[0] - 1)

  monkeypatch.setattr(recorder.time, "perf_counter", perf_counter)
  progress = recorder.Progress([SimpleNamespace(name="a")], 0, 2000)
  caplog.set_level(logging.INFO)
  for step in range(1, 201):
    at[0] = step
    before = len(caplog.records)
    progress.report(step, {"a": 3.0}, {})
    if len(caplog.records) > before:
      reported.append(step)
  lines = [r.getMessage() for r in caplog.records if "step " in r.getMessage()]
  assert reported == [1, 11, 100, 200]
  assert "ETA after the first interval" in lines[0]
  assert "10.00 steps/s | ETA 199s" in lines[1]  # (2000 - 11) steps at 0.1 s


def test_a_programs_last_progress_line_says_how_its_runs_ended(caplog):
  """Issue 78, item 15: a finished program's last line said `runs alive 0/2`."""
  import logging
  from types import SimpleNamespace
  from normstudy.engine import recorder
  from normstudy.records import schema
  caplog.set_level(logging.INFO)
  progress = recorder.Progress([SimpleNamespace(name="a"), SimpleNamespace(name="b"),
                                SimpleNamespace(name="c")], 0, 100)
  progress.report(50, {"a": 3.0, "b": 2.0, "c": 2.5}, {1: schema.HALTED})
  progress.report(100, {"a": 2.0, "c": 2.1},
                  {0: schema.FINISHED, 1: schema.HALTED, 2: schema.FINISHED})
  lines = [r.getMessage() for r in caplog.records if "step " in r.getMessage()]
  assert "runs alive 2/3, halted 1" in lines[0]
  assert f"runs ended: 2 {schema.FINISHED}, 1 {schema.HALTED}" in lines[-1]
  assert "alive" not in lines[-1]
  caplog.clear()
  alone = recorder.Progress([SimpleNamespace(name="a")], 0, 10)
  alone.report(10, {"a": 2.0}, {0: schema.FINISHED})
  assert f"run ended: 1 {schema.FINISHED}" in caplog.records[-1].getMessage()


def test_step_ticks_are_in_one_unit_across_the_axis():
  """Issue 78, item 21: a 1000-step run's axis read `0 ... 800 1K`. Thousands only when the
  axis reaches 10,000 steps (the paper's 0-100K), then on every tick; plain steps otherwise,
  also on the figure as drawn."""
  from matplotlib.figure import Figure
  from normstudy.analysis import plots
  assert plots.step_ticks([0, 200, 400, 600, 800, 1000]) == ["0", "200", "400", "600", "800",
                                                             "1000"]
  assert plots.step_ticks([0, 25, 150]) == ["0", "25", "150"]
  assert plots.step_ticks([0, 20000, 40000, 100000]) == ["0", "20K", "40K", "100K"]
  assert plots.step_ticks([0, 2500, 5000, 7500, 10000]) == ["0", "2.5K", "5K", "7.5K", "10K"]
  for last in (1000, 2000, 100_000):
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, last], [0, 1])
    ax.xaxis.set_major_formatter(plots._step_formatter())
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text() not in ("", "0")]
    units = {label.endswith("K") for label in labels}
    assert units == {last >= plots.THOUSANDS_FROM}, (last, labels)


def test_an_arm_over_seeds_is_not_labelled_as_one_run():
  """Issue 78, item 21: "Gradient Clip=10 | Run 1 (3 seeds)". MERT's "| Run N" is dropped
  where the arms stay distinct, else it reads "arm N"."""
  from normstudy.analysis import plots
  labels = ["Pre-Norm | Gradient Clip=10 | Run 1", "Pre-Norm | Gradient Clip=1 | Run 2",
            "Post-Norm | DeepNorm | Gradient Clip=1"]
  assert plots.arm_legend_labels(labels, [3, 3, 1]) == [
      "Pre-Norm | Gradient Clip=10 (3 seeds)", "Pre-Norm | Gradient Clip=1 (3 seeds)",
      "Post-Norm | DeepNorm | Gradient Clip=1 (1 seed)"]
  assert plots.arm_legend_labels(["A | Run 1", "A | Run 2"], [2, 2]) == [
      "A | arm 1 (2 seeds)", "A | arm 2 (2 seeds)"]


def test_update_norm_spikes_before_loss_spikes_are_counted_against_chance(tmp_path):
  """spikes.csv: per run the loss spikes, the update-norm spikes (a doubling above the trend of
  log10 update_norm) and the loss spikes an update spike preceded within 10 steps; the
  observations' exact binomial test against the share of steps after update spikes (scipy)."""
  import json
  import pandas as pd
  from scipy import stats as scipy_stats
  from normstudy import analysis
  from normstudy.analysis import update_spikes as spikes
  rng = np.random.default_rng(0)
  for name, update_at, loss_at in (("a", [40, 120], [43, 125, 170]), ("b", [], [60])):
    run = tmp_path / name
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"label": name, "status": "finished"}))
    records = []
    for step in range(1, 201):
      loss = 3.0 - step / 400 + 0.01 * rng.normal() + (1.5 if step in loss_at else 0.0)
      norm = 0.05 * math.exp(0.05 * rng.normal()) * (6.0 if step in update_at else 1.0)
      records.append({"step": step, "loss": loss, "update_norm": norm})
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
  outputs = analysis.analyze(str(tmp_path))
  table = pd.read_csv(outputs["spikes"]).set_index("run")
  assert table.loc["a", "loss_spike_steps"] == "43 125 170"
  assert table.loc["a", "update_spike_steps"] == "40 120"
  assert table.loc["a", "preceded"] == 2 and table.loc["b", "preceded"] == 0
  assert table.loc["a", "steps_after_update_spikes"] == 20  # steps 41-50 and 121-130
  got = spikes.test(table)
  chance = 20 / 400
  assert got["chance"] == pytest.approx(chance)
  assert got["p"] == pytest.approx(scipy_stats.binomtest(2, 4, chance).pvalue)
  text = open(outputs["observations"], encoding="utf-8").read()
  assert "2 of 4 loss spikes had an update-norm spike start within the 10 steps before" in text


def test_figure_formats_are_the_vector_copies_beside_each_png(tmp_path, monkeypatch):
  from matplotlib.figure import Figure
  from normstudy import errors
  for i, (value, written) in enumerate(((None, {"png", "svg"}), ("pdf, svg", {"png", "pdf", "svg"}),
                                       ("", {"png"}), ("PDF", {"png", "pdf"}))):
    if value is None:
      monkeypatch.delenv(schema.FIGURE_FORMATS_ENV, raising=False)
    else:
      monkeypatch.setenv(schema.FIGURE_FORMATS_ENV, value)
    folder = tmp_path / str(i)
    folder.mkdir()
    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    assert plots.save(fig, str(folder / "f.png")) == str(folder / "f.png")
    assert {p.suffix[1:] for p in folder.iterdir()} == written
    assert (folder / "f.png").read_bytes().startswith(b"\x89PNG")
    if "pdf" in written:
      assert (folder / "f.pdf").read_bytes().startswith(b"%PDF")
  for bad in ("eps", "svg,svg", "png"):
    monkeypatch.setenv(schema.FIGURE_FORMATS_ENV, bad)
    with pytest.raises(errors.UserError) as refused:
      schema.figure_formats()
    assert str(refused.value) == (
        f"NORMSTUDY_FIGURE_FORMATS={bad!r} is not allowed; allowed: formats saved beside each "
        "PNG, comma-separated, each once, from svg, pdf; empty for PNG only")


def test_a_command_refuses_figure_formats_it_cannot_write_before_writing(tmp_path):
  import os
  import runs
  workdir = tmp_path / "sweep"
  result = runs.run_module(
      "normstudy.sweep", "--config=configs/seed_figure.py", "--axis=train.seed=0,1",
      f"--workdir={workdir}", check=False, env=dict(os.environ, NORMSTUDY_FIGURE_FORMATS="eps"))
  assert result.returncode == 2 and result.stderr.strip().splitlines() == [
      "error: NORMSTUDY_FIGURE_FORMATS='eps' is not allowed; allowed: formats saved beside each "
      "PNG, comma-separated, each once, from svg, pdf; empty for PNG only"]
  assert not workdir.exists()

"""End to end: the study runner (with an arm that halts), the single-run command line, resume,
the figure, the summary and the notebook."""

import os
import textwrap
import re

import numpy as np
import pandas as pd
import pytest

from normstudy import analysis
from normstudy.records import schema
import fresh_env
import runs

pytestmark = pytest.mark.slow

SEED_FIGURE = "configs/seed_figure.py"
STUDY_ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
            "pre_norm_attn_relax_clip1")
LABELS = ("Pre-Norm | Gradient Clip=10 | Run 1", "Pre-Norm | Gradient Clip=1 | Run 2",
          "Post-Norm | DeepNorm | Gradient Clip=1",
          "Pre-Norm | Attention Relax | Gradient Clip=1")
RECORD_KEYS = {"step", "loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped",
               "tokens_per_sec"}


def _halting_study(tmp_path):
  """The seed figure with its attention-relax arm at a learning rate of 1e3 (and a loss-scale
  floor of 32, so its overflow storm reaches the floor within a few steps)."""
  path = tmp_path / "halting_study.py"
  path.write_text(textwrap.dedent("""
      import dataclasses

      from configs import seed_figure

      ARMS = dict(seed_figure.EXPERIMENT.arms)
      label, settings = ARMS["pre_norm_attn_relax_clip1"]
      ARMS["pre_norm_attn_relax_clip1"] = (label, {
          **settings, "optimizer.learning_rate": 1e3,
          "optimizer.loss_scale.min_scale": 32.0})
      EXPERIMENT = dataclasses.replace(seed_figure.EXPERIMENT, arms=ARMS, seeds=())
      get_config = EXPERIMENT.get_config
      """))
  return str(path)


def test_study_with_a_halting_arm_then_extension_and_skips(tmp_path):
  study = tmp_path / "study"
  data_dir = tmp_path / "tfds"
  config = _halting_study(tmp_path)
  # One process: worker processes have their own test (test_workers.py) and cost start-ups here.
  # Telemetry end to end (records, per-layer figures, the notebook's) is test_sweep.py's.
  args = (f"--config={config}", f"--workdir={study}", *runs.tiny_args(data_dir, num_steps=6),
          "--workers=1")
  # The figures' SVG copies too (the suite writes PNG alone: conftest.py).
  result = runs.run_inline("normstudy.study", *args,  # exit 0: a halted arm is a result
                           environ={"NORMSTUDY_FIGURE_FORMATS": "svg"})
  assert f"figure: {study}/loss_comparison.png" in result.stdout
  for variant, label in zip(STUDY_ARMS[:3], LABELS):
    run_dir = study / variant
    recs = runs.records(run_dir)
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert all(RECORD_KEYS <= set(r) for r in recs)
    assert [r["step"] for r in recs if "eval_loss" in r] == [3, 6]
    config_json = runs.read_json(run_dir / "config.json")
    assert config_json["train"]["num_steps"] == 6
    assert config_json["model"]["d_model"] == 16  # the override reached every run
    info = runs.read_json(run_dir / "run.json")
    assert info["label"] == label and info["status"] == "finished"
    assert info["entropy_floor"] > 0 and info["dataset"].startswith("synthetic_markov/")
    assert recs[0]["loss_scale"] == 128.0  # float16 runs start at fairseq's initial scale
  assert runs.read_json(study / "pre_norm_clip10" / "config.json")["optimizer"][
      "clip_norm"] == 10.0
  # Clip 10 and clip 1 differ only in data: one program, one stacked checkpoint directory.
  programs = sorted(os.listdir(study / "checkpoints"))
  assert len(programs) == 3 and programs[2].startswith("pre_norm_clip10+1_")

  halted = runs.read_json(study / "pre_norm_attn_relax_clip1" / "run.json")
  assert halted["status"] == "halted"
  assert halted["halt_reason"] == "loss scale at its minimum (32)"
  assert halted["halt_kind"] == schema.HaltKind.LOSS_SCALE.value == "loss_scale"
  assert halted["nonfinite_at"]
  recs = runs.records(study / "pre_norm_attn_relax_clip1")
  assert recs[-1]["step"] == halted["halt_step"] < 6
  assert recs[-1]["nonfinite_at"] == halted["nonfinite_at"]

  png = (study / "loss_comparison.png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 20_000
  assert (study / "loss_comparison.svg").exists()
  summary = pd.read_csv(study / "summary.csv").set_index("run")
  assert sorted(summary.label) == sorted(LABELS)
  assert list(summary.status[list(STUDY_ARMS)]) == ["finished"] * 3 + ["halted"]
  assert summary.loc["pre_norm_attn_relax_clip1", "halt_reason"] == halted["halt_reason"]
  for variant in STUDY_ARMS[:3]:
    row = summary.loc[variant]
    recs = runs.records(study / variant)
    assert row.steps == 6
    assert row.final_loss == pytest.approx(recs[-1]["loss"])
    assert row.final_eval_loss == pytest.approx(recs[-1]["eval_loss"])
    assert row.min_loss_scale == min(r["loss_scale"] for r in recs)
  observations = (study / "observations.md").read_text()
  for label in LABELS:
    assert f"## {label}" in observations
  assert (f"Halted: {LABELS[3]} at step {halted['halt_step']} (loss scale at its minimum (32), "
          f"first non-finite: {halted['nonfinite_at']})") in observations
  _execute_notebook(study, tmp_path)

  # Extending the study resumes every run from its last checkpoint: no step is logged twice,
  # and the halted arm stays a result.
  first = {v: runs.records(study / v) for v in STUDY_ARMS}
  extended = (f"--config={config}", f"--workdir={study}", *runs.tiny_args(data_dir, num_steps=9),
              "--workers=1")
  result = runs.run_inline("normstudy.study", *extended)
  for variant in STUDY_ARMS[:3]:
    recs = runs.records(study / variant)
    assert [r["step"] for r in recs] == list(range(1, 10))
    assert recs[:6] == first[variant]
  assert runs.records(study / STUDY_ARMS[3]) == first[STUDY_ARMS[3]]
  assert "keeps the horizon of 6 steps" in result.stderr
  # A finished study is skipped program by program.
  again = runs.run_inline("normstudy.study", *extended)
  assert again.stderr.count("finished earlier, skipped") == 3


def _execute_notebook(study, tmp_path):
  """Runs notebooks/compare_runs.ipynb headless against the study, in a fresh environment with
  only what its install cell installs and what Colab has (tests/fresh_env.py)."""
  nb = fresh_env.execute_notebook(study, tmp_path)
  text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
  assert "4 runs" in text
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) >= 2  # comparison, overlay


def test_localize_copies_run_files_but_not_checkpoints(tmp_path):
  remote = tmp_path / "remote" / "run"
  (remote / "checkpoints" / "3").mkdir(parents=True)
  (remote / "checkpoints" / "3" / "blob").write_bytes(b"x" * 100)
  (remote / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
  (remote / "config.json").write_text('{"label": "R"}')
  local = analysis.localize(str(tmp_path / "remote"), str(tmp_path / "cache"), force_copy=True)
  assert (tmp_path / "cache" / "run" / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'
  assert (tmp_path / "cache" / "run" / "config.json").exists()
  assert not (tmp_path / "cache" / "run" / "checkpoints").exists()
  assert set(analysis.load_runs(local).table.label) == {"R"}
  assert analysis.localize(str(tmp_path)) == str(tmp_path)  # local paths are used in place


@pytest.mark.slow
def test_single_run_command_line_and_overrides(tmp_path):
  workdir = tmp_path / "run"
  result = runs.run_inline(
      "normstudy.main", f"--config={SEED_FIGURE}:pre_norm_attn_relax_clip1",
      f"--workdir={workdir}", *runs.tiny_args(tmp_path / "tfds", num_steps=4),
      "--config.optimizer.clip_norm=0.25", "--config.model.dtype=float32")
  recs = runs.records(workdir)
  evals = [r for r in recs if "eval_loss" in r]
  assert result.stdout.strip().splitlines()[-1] == (
      f"finished: step 4, loss {recs[-1]['loss']:.4f}, eval loss {evals[-1]['eval_loss']:.4f} "
      f"(step {evals[-1]['step']}); records in {workdir}")
  config = runs.read_json(workdir / "config.json")
  assert config["optimizer"]["clip_norm"] == 0.25
  assert config["model"]["attention_relax"] == 32.0
  recs = runs.records(workdir)
  assert all(r["loss_scale"] == 1.0 for r in recs)  # float32: no loss scaling
  assert config["train"]["tensorboard"] is False  # runs.TINY: metrics.jsonl only
  assert not [n for n in os.listdir(workdir) if n.startswith("events.out.tfevents")]
  assert all(r["clipped"] == (r["grad_norm"] > 0.25) for r in recs)
  loaded = analysis.load_runs(str(workdir))
  df = loaded.table
  assert set(df.columns) == {"run", "label", "step", "metric", "value"}
  # The label says what the run is, overrides included.
  assert set(df.label) == {"Pre-Norm | Attention Relax | Gradient Clip=0.25"}
  losses = analysis.series(loaded, ".", "loss")
  assert list(losses.index) == [1, 2, 3, 4]
  assert list(losses.values) == [r["loss"] for r in recs]


@pytest.mark.slow
def test_commands_keep_compiled_programs_on_disk_and_reuse_them_to_the_same_bits(tmp_path):
  # The default place (normstudy.cli.COMPILE_CACHE_ENV), under XDG_CACHE_HOME.
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env.update(XDG_CACHE_HOME=str(tmp_path / "cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # even the tiny model's programs
  cache = tmp_path / "cache" / "normstudy" / "xla" / f"cpus{len(os.sched_getaffinity(0))}"
  args = (f"--config={SEED_FIGURE}:pre_norm_clip1", *runs.tiny_args(tmp_path / "tfds"))
  runs.run_module("normstudy.main", f"--workdir={tmp_path / 'first'}", *args, env=env)
  written = sorted(os.listdir(cache))
  assert any(name.startswith("jit_") for name in written)
  # Its size cap's bookkeeping (jax's LRU cache): an access time beside every entry.
  entries = [name[:-len("-cache")] for name in written if name.endswith("-cache")]
  assert entries and all(f"{key}-atime" in written for key in entries)
  runs.run_module("normstudy.main", f"--workdir={tmp_path / 'second'}", *args, env=env)
  assert sorted(os.listdir(cache)) == written  # every program found, none compiled again
  assert runs.trajectory(tmp_path / "first") == runs.trajectory(tmp_path / "second")


@pytest.mark.slow
def test_a_cache_directory_shared_with_other_jax_programs_still_takes_a_commands_programs(
    tmp_path):
  # An entry as a JAX process without a size cap leaves it: no "-atime" file beside it. A
  # capped command (jax 0.10.2's LRU cache) would then fail every write in the directory
  # (normstudy.cli, above COMPILE_CACHE_ENV); in a directory the user chose it sets no cap.
  shared = tmp_path / "shared"
  shared.mkdir()
  (shared / "jit_elsewhere-0123abcd-cache").write_bytes(b"another program's executable")
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(shared),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)
  result = runs.run_module("normstudy.main", f"--workdir={tmp_path / 'run'}",
                           "--config=configs/lm.py:tiny", *runs.tiny_args(tmp_path / "tfds"),
                           env=env)
  log = (tmp_path / "run" / "normstudy.log").read_text()
  for text in (result.stderr, log):
    assert "Error writing persistent compilation cache" not in text
  foreign = {"jit_elsewhere-0123abcd-cache"}
  written = {name for name in os.listdir(shared) if name.endswith("-cache")}
  assert written > foreign, written  # the other entry kept, and the command's own beside it


def test_a_study_over_seeds_draws_each_arm_as_median_and_range(tmp_path):
  """normstudy.study --seeds (issue 45: one seed per arm in fp16 is chaotic across CPU kinds):
  each variant once per seed in DIR/<variant>/seed<k>, each seed's records those normstudy.main
  trains for it alone (sweep.json's command), arms.csv each arm's median, lowest and highest
  over its seeds of the per-run summary, the figure drawn; bad --seeds refused in one line."""
  data_dir = tmp_path / "tfds"
  study = tmp_path / "study"
  args = ("--config=configs/seed_figure.py", *runs.tiny_args(data_dir, num_steps=6))
  result = runs.run_inline("normstudy.study", f"--workdir={study}", "--seeds=0,2", "--workers=1",
                           *args)
  assert f"figure: {study}/loss_comparison.png" in result.stdout
  arms = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
          "pre_norm_attn_relax_clip1")
  assert sorted(os.listdir(study / "pre_norm_clip1")) == ["seed0", "seed2"]
  sweep = runs.read_json(study / "sweep.json")
  command = next(r["command"] for r in sweep["runs"] if r["name"] == "pre_norm_clip1/seed2")
  assert "--config=configs/seed_figure.py:pre_norm_clip1" in command
  assert "--config.train.seed=2" in command
  alone = tmp_path / "alone"
  runs.run_inline("normstudy.main", "--config=configs/seed_figure.py:pre_norm_clip1",
                  f"--workdir={alone}", "--config.train.seed=2", *args[1:])
  assert runs.trajectory(alone) == runs.trajectory(study / "pre_norm_clip1" / "seed2")
  # Issue 78, item 19: the README names each table of the study by the name the study writes
  # (docs/seed_figure/arms.csv, not docs/seed_figure_arms.csv), in its study's folder.
  readme = open(os.path.join(runs.REPO, "README.md"), encoding="utf-8").read()
  named = re.findall(r"docs/seed_figure[\w/.]*\.(?:csv|png|md)", readme)
  assert "docs/seed_figure/speed_tests.csv" in named, named
  for path in named:
    folder, name = os.path.split(path)
    assert folder in ("docs/seed_figure", "docs/seed_figure_text"), path
    assert name in os.listdir(study), (path, sorted(os.listdir(study)))
  # Issue 78, item 21: an arm over seeds is no "Run 1" (MERT's label for one run); the steps
  # axis in one unit style.
  from normstudy.analysis import plots
  figure = plots.comparison_figure(analysis.load_runs(str(study)))
  legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
  assert "Pre-Norm | Gradient Clip=10 (2 seeds)" in legend, legend
  assert not any(re.search(r"Run \d+ \(\d+ seeds\)", entry) for entry in legend), legend
  figure.canvas.draw()
  ticks = [t.get_text() for t in figure.axes[-1].get_xticklabels() if t.get_text()]
  assert ticks and all(not t.endswith("K") for t in ticks), ticks  # a 6-step run
  summary = pd.read_csv(study / "summary.csv").set_index("run")
  table = pd.read_csv(study / "arms.csv").set_index("arm")
  assert list(table.index) == list(arms) and (table.seeds == 2).all()
  for arm in arms:
    losses = summary.loc[[f"{arm}/seed0", f"{arm}/seed2"], "final_eval_loss"]
    assert table.loc[arm, "final_eval_loss"] == pytest.approx(float(np.median(losses)))
    assert table.loc[arm, "final_eval_loss_min"] == pytest.approx(losses.min())
    assert table.loc[arm, "final_eval_loss_max"] == pytest.approx(losses.max())
  for bad in ("0,0", "-1", "a"):
    refused = runs.run_inline("normstudy.study", f"--workdir={tmp_path / 'bad'}",
                              f"--seeds={bad}", *args, check=False)
    assert refused.returncode == 2 and not (tmp_path / "bad").exists()
    assert refused.stderr.strip().splitlines() == [
        f"error: --seeds={bad} is not allowed; allowed: distinct integers >= 0, e.g. "
        "--seeds=0,1,2"]


def test_the_notebooks_default_workdir_is_the_repositorys_from_notebooks_too(tmp_path,
                                                                             monkeypatch):
  """Issue 88, item 16: run by jupyter (its kernel in notebooks/), the notebook's default
  runs/seed_figure was looked up in notebooks/ and reported missing while it existed. Its
  parameters cell, run from notebooks/ and from the root, finds the repository's."""
  import json as json_
  nb = json_.load(open(os.path.join(runs.REPO, "notebooks", "compare_runs.ipynb")))
  cell = next("".join(c["source"]) for c in nb["cells"]
              if "".join(c["source"]).startswith("# Parameters"))
  (tmp_path / "runs" / "seed_figure").mkdir(parents=True)
  (tmp_path / "notebooks").mkdir()
  monkeypatch.delenv("NORMSTUDY_WORKDIR", raising=False)
  for cwd, expected in ((tmp_path / "notebooks", os.path.join("..", "runs/seed_figure")),
                        (tmp_path, "runs/seed_figure")):
    monkeypatch.chdir(cwd)
    namespace = {"os": os}
    exec(cell, namespace)  # noqa: S102 (the notebook's own cell)
    assert namespace["WORKDIR"] == expected
    assert os.path.isdir(namespace["WORKDIR"])

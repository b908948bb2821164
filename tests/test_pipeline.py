"""End to end: the study runner, the single-run command line, resume, the figure and summary."""

import os

import pandas as pd
import pytest

from normstudy import analysis
import runs

pytestmark = pytest.mark.slow

SEED_FIGURE = "configs/seed_figure.py"
VARIANTS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
            "pre_norm_attn_relax_clip1")
LABELS = ("Pre-Norm | Gradient Clip=10 | Run 1", "Pre-Norm | Gradient Clip=1 | Run 2",
          "Post-Norm | DeepNorm | Gradient Clip=1",
          "Pre-Norm | Attention Relax | Gradient Clip=1")
RECORD_KEYS = {"step", "loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped",
               "tokens_per_sec"}


def test_study_runs_every_variant_then_resumes_and_skips(tmp_path):
  study = tmp_path / "study"
  data_dir = tmp_path / "tfds"
  result = runs.run_module("normstudy.study", f"--config={SEED_FIGURE}", f"--workdir={study}",
                           *runs.tiny_args(data_dir, num_steps=6))
  assert f"figure: {study}/loss_comparison.png" in result.stdout
  for variant, label in zip(VARIANTS, LABELS):
    run_dir = study / variant
    recs = runs.records(run_dir)
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert all(RECORD_KEYS <= set(r) for r in recs)
    assert [r["step"] for r in recs if "eval_loss" in r] == [3, 6]
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["3", "6"]
    config = runs.read_json(run_dir / "config.json")
    assert config["label"] == label and config["train"]["num_steps"] == 6
    assert config["model"]["d_model"] == 16  # the override reached every run
    info = runs.read_json(run_dir / "run.json")
    assert info["entropy_floor"] > 0 and info["dataset"].startswith("synthetic_markov/")
    assert recs[0]["loss_scale"] == 128.0  # float16 runs start at fairseq's initial scale
  clip10 = runs.read_json(study / "pre_norm_clip10" / "config.json")
  assert clip10["optimizer"]["clip_norm"] == 10.0
  assert runs.read_json(study / "post_norm_deepnorm_clip1" / "config.json")["model"][
      "placement"] == "deepnorm"

  png = (study / "loss_comparison.png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 20_000
  summary = pd.read_csv(study / "summary.csv")
  assert sorted(summary.label) == sorted(LABELS)
  for variant in VARIANTS:
    row = summary[summary.run == variant].iloc[0]
    recs = runs.records(study / variant)
    assert row.steps == 6
    assert row.final_loss == pytest.approx(recs[-1]["loss"])
    assert row.min_loss == pytest.approx(min(r["loss"] for r in recs))
    assert row.final_eval_loss == pytest.approx(recs[-1]["eval_loss"])
    assert row.min_loss_scale == min(r["loss_scale"] for r in recs)

  # Extending the study resumes every run from its last checkpoint: no step is logged twice.
  first = {v: runs.records(study / v) for v in VARIANTS}
  runs.run_module("normstudy.study", f"--config={SEED_FIGURE}", f"--workdir={study}",
                  *runs.tiny_args(data_dir, num_steps=9))
  for variant in VARIANTS:
    recs = runs.records(study / variant)
    assert [r["step"] for r in recs] == list(range(1, 10))
    assert recs[:6] == first[variant]
    assert "9" in os.listdir(study / variant / "checkpoints")
  # A finished study is skipped run by run.
  again = runs.run_module("normstudy.study", f"--config={SEED_FIGURE}", f"--workdir={study}",
                          *runs.tiny_args(data_dir, num_steps=9))
  assert again.stderr.count("finished earlier, skipped") == 4


def test_single_run_command_line_and_overrides(tmp_path):
  workdir = tmp_path / "run"
  runs.run_module("normstudy.main", f"--config={SEED_FIGURE}:pre_norm_attn_relax_clip1",
                  f"--workdir={workdir}", *runs.tiny_args(tmp_path / "tfds", num_steps=4),
                  "--config.optimizer.clip_norm=0.25", "--config.model.dtype=float32")
  config = runs.read_json(workdir / "config.json")
  assert config["optimizer"]["clip_norm"] == 0.25
  assert config["model"]["attention_relax"] == 32.0
  recs = runs.records(workdir)
  assert all(r["loss_scale"] == 1.0 for r in recs)  # float32: no loss scaling
  assert all(r["clipped"] == (r["grad_norm"] > 0.25) for r in recs)
  df = analysis.load_runs(str(workdir))
  assert set(df.columns) == {"run", "label", "step", "metric", "value"}
  assert set(df.label) == {"Pre-Norm | Attention Relax | Gradient Clip=1"}
  losses = analysis.series(df, ".", "loss")
  assert list(losses.index) == [1, 2, 3, 4]
  assert list(losses.values) == [r["loss"] for r in recs]

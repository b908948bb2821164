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
                           *runs.tiny_args(data_dir, num_steps=6),
                           "--config.train.telemetry_every=2")
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

  observations = (study / "observations.md").read_text()
  for label in LABELS:
    assert f"## {label}" in observations
  assert "## Comparison" in observations
  for metric in ("attn_logit_max", "act_rms", "grad_norm"):
    assert (study / f"layers_{metric}.png").read_bytes().startswith(b"\x89PNG")
  recs = runs.records(study / "pre_norm_clip1")
  assert [r["step"] for r in recs if "act_rms/layer_1" in r] == [2, 4, 6]
  assert all("fp16_overflows" in r for r in recs if "act_rms/layer_1" in r)
  _execute_notebook(study, tmp_path)

  # Extending the study resumes every run from its last checkpoint: no step is logged twice.
  first = {v: runs.records(study / v) for v in VARIANTS}
  runs.run_module("normstudy.study", f"--config={SEED_FIGURE}", f"--workdir={study}",
                  *runs.tiny_args(data_dir, num_steps=9), "--config.train.telemetry_every=2")
  for variant in VARIANTS:
    recs = runs.records(study / variant)
    assert [r["step"] for r in recs] == list(range(1, 10))
    assert recs[:6] == first[variant]
    assert "9" in os.listdir(study / variant / "checkpoints")
  # A finished study is skipped run by run.
  again = runs.run_module("normstudy.study", f"--config={SEED_FIGURE}", f"--workdir={study}",
                          *runs.tiny_args(data_dir, num_steps=9),
                          "--config.train.telemetry_every=2")
  assert again.stderr.count("finished earlier, skipped") == 4


def _execute_notebook(study, tmp_path):
  """Runs notebooks/compare_runs.ipynb headless against the study; any failing cell fails."""
  import nbclient
  import nbformat
  nb = nbformat.read(os.path.join(runs.REPO, "notebooks", "compare_runs.ipynb"), as_version=4)
  os.environ["NORMSTUDY_WORKDIR"] = str(study)
  try:
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    del os.environ["NORMSTUDY_WORKDIR"]
  text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
  assert "4 runs" in text
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) >= 5  # comparison, 3 heatmaps, overlay


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
  assert set(analysis.load_runs(local).label) == {"R"}
  assert analysis.localize(str(tmp_path)) == str(tmp_path)  # local paths are used in place


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

"""The experiment as one object (issue 87): a config file's EXPERIMENT, its derived get_config,
its kind, and `python -m normstudy.run`, which runs any experiment by its kind."""

import dataclasses
import json
import os
import textwrap

import pytest

from normstudy import errors
from normstudy import run as run_command
from normstudy.core import config as config_lib
from normstudy.core.experiment import Drift, Experiment, Heldout, Ladder, Techniques
from normstudy.experiments import grid
import runs


def _stages(name: str, study: bool = False, workers=None) -> list:
  path = f"configs/{name}.py"
  return run_command.stages(grid.load_experiment(os.path.join(runs.REPO, path)), path,
                            f"runs/{name}", workers, study)


def test_each_kind_runs_its_command_then_what_it_lists():
  """The make targets' one rule: each config file's stages, as a user would type them."""
  where = lambda name: [f"--config=configs/{name}.py", f"--workdir=runs/{name}"]  # noqa: E731
  assert _stages("ladder", workers=1) == [
      ["normstudy.ladder", *where("ladder"), "--sweep_arg=--workers=1"]]
  assert _stages("ladder_mup") == [["normstudy.ladder", *where("ladder_mup")]]
  assert _stages("drift", workers=2) == [["normstudy.drift", *where("drift"), "--workers=2"]]
  assert _stages("techniques") == [["normstudy.sweep", *where("techniques")],
                                   ["normstudy.techniques", *where("techniques")]]
  assert _stages("spike_failure")[1] == ["normstudy.techniques", *where("spike_failure")]
  assert _stages("survival") == [["normstudy.sweep", *where("survival")]]
  # A grid with axes is a sweep; --study (make study) trains its study arms instead.
  assert _stages("seed_figure") == [["normstudy.sweep", *where("seed_figure")]]
  assert _stages("seed_figure", study=True) == [["normstudy.study", *where("seed_figure")]]
  # Arms alone (no axes, search or parts) are a study; then what the experiment lists.
  assert _stages("horizon") == [
      ["normstudy.study", *where("horizon")],
      ["normstudy.forecast", "--workdir=runs/horizon", "--out=runs/horizon"]]
  assert _stages("forecast_validation")[1] == [
      "normstudy.forecast", "--validate", "--workdir=runs/forecast_validation",
      "--workdir=runs/horizon", "--out=runs/forecast_validation"]
  assert _stages("attention") == [
      ["normstudy.sweep", *where("attention")],
      ["normstudy.context_gap", "--workdir=runs/attention/context"],
      ["normstudy.context_gap", "--workdir=runs/attention/chain"]]


def test_the_kind_is_the_field_that_declares_it():
  ladder = Ladder(rungs=((4, 32),), dtypes=("float16",), rung_overrides=dict)
  held = Heldout(arms=("a",), steps=2, seeds=(0,), fractions=(0.5,))
  drift = Drift(law_arms=("a",), decay_base="a", weight_decays={}, num_steps=1, heldout=held)
  assert Experiment().kind == "grid"
  assert Experiment(ladder=ladder).kind == "ladder"
  assert Experiment(drift=drift).kind == "drift"
  assert Experiment(techniques=Techniques(baselines={"b": "a"})).kind == "techniques"


def test_get_config_is_the_base_then_the_arm_and_names_the_arms_it_has():
  arms = {"post": ("Post", {"model.placement": "post_ln"}),
          "pre": ("Pre", {"model.placement": "pre_ln", "optimizer.clip_norm": 10.0})}
  declared = Experiment(base=config_lib.default_config, arms=arms, default_arm="pre")
  expected = config_lib.default_config()
  expected.model.placement, expected.optimizer.clip_norm, expected.label = "pre_ln", 10.0, "Pre"
  assert declared.get_config().to_dict() == expected.to_dict()  # the default arm
  assert declared.get_config("post").model.placement == "post_ln"
  assert dataclasses.replace(declared, default_arm="").get_config().label == "Post"  # the first
  with pytest.raises(ValueError, match="unknown variant 'side'; variants: post, pre"):
    declared.get_config("side")
  sizes = dataclasses.replace(declared, arm_kind="size")
  with pytest.raises(ValueError, match="unknown size 'xl'; sizes: post, pre"):
    sizes.get_config("xl")


def test_sweep_json_records_the_experiment_with_its_functions_by_name():
  def rung_overrides(num_layers, d_model):
    return {}
  declared = Experiment(base=config_lib.default_config, arms={"a": ("A", {})},
                        ladder=Ladder(rungs=((4, 32),), dtypes=("float16",),
                                      rung_overrides=rung_overrides))
  record = json.loads(json.dumps(declared.as_json()))
  assert record["base"] == "config.py:default_config"
  assert record["ladder"]["rungs"] == [[4, 32]]
  assert record["ladder"]["rung_overrides"] == (
      "test_run.py:test_sweep_json_records_the_experiment_with_its_functions_by_name.<locals>."
      "rung_overrides")
  assert record["arms"] == {"a": ["A", {}]} and record["drift"] is None
  builtin = dataclasses.replace(declared, ladder=dataclasses.replace(declared.ladder,
                                                                     rung_overrides=dict))
  assert builtin.as_json()["ladder"]["rung_overrides"] == "dict"


def test_study_on_another_kind_is_one_line_and_runs_nothing(tmp_path):
  refused = runs.run_module("normstudy.run", "--config=configs/ladder.py",
                            f"--workdir={tmp_path / 'w'}", "--study", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
  assert refused.stderr.strip() == ("error: --study is for an experiment of kind grid; "
                                    "configs/ladder.py's is ladder (leave --study out)")
  assert not (tmp_path / "w").exists()
  with pytest.raises(errors.UserError, match="exports no EXPERIMENT"):
    grid.load_experiment(os.path.join(runs.REPO, "normstudy", "run.py"))


@pytest.mark.slow
def test_run_trains_a_study_then_its_listed_command_each_in_its_process(tmp_path):
  """A tiny experiment of one arm, no axes (a study), and an analysis listed after it: both
  stages print their command and run, and the same command again trains nothing."""
  config = tmp_path / "tiny.py"
  config.write_text(textwrap.dedent(f"""
      from configs import seed_figure
      from normstudy.core.experiment import Experiment

      def base():
        config = seed_figure.base_config()
        config.model.update(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=16,
                            vocab_size=32)
        config.train.update(batch_size=4, num_steps=4, eval_every=2, checkpoint_every=2,
                            eval_steps=2, tensorboard=False, telemetry_every=0)
        config.data.update(train_tokens=16384, validation_tokens=4096,
                           data_dir={str(tmp_path / 'tfds')!r})
        config.optimizer.warmup_steps = 2
        return config

      EXPERIMENT = Experiment(base=base, arms={{"a": ("A", {{}})}},
                              then=("normstudy.analyze --workdir={{workdir}}",))
      get_config = EXPERIMENT.get_config
      """))
  workdir = tmp_path / "w"
  first = runs.run_module("normstudy.run", f"--config={config}", f"--workdir={workdir}",
                          "--workers=1")
  said = [line for line in first.stdout.splitlines() if line.startswith("[run]")]
  assert said[:2] == [
      f"[run] grid, stage 1/2: python -m normstudy.study --config={config} --workdir={workdir}"
      " --workers=1",
      f"[run] grid, stage 2/2: python -m normstudy.analyze --workdir={workdir}"]
  assert runs.read_json(workdir / "a" / "run.json")["last_step"] == 4
  assert (workdir / "summary.csv").is_file()
  records = runs.records(workdir / "a")
  again = runs.run_module("normstudy.run", f"--config={config}", f"--workdir={workdir}",
                          "--workers=1")
  assert "[run] done: 2 stage(s)" in again.stdout and runs.records(workdir / "a") == records

"""Sweeps: the grid, equivalence with single runs, per-run halting, and resume after SIGKILL."""

import json
import os
import re
import shlex
import signal
import textwrap

import pytest

from normstudy import errors
from normstudy.core import labels
from normstudy.core.experiment import Experiment
from normstudy.engine import execution
from normstudy.engine import schedule
from normstudy.experiments import grid
from normstudy.experiments import planning
from normstudy.records import names
from normstudy.records import rundir
from normstudy.records import schema
import fresh_env
import inprocess
import runs


def test_axes_parse_merge_and_name_points(tmp_path):
  assert grid.parse_axis("optimizer.learning_rate=1e-3,3e-3") == (
      "optimizer.learning_rate", [1e-3, 3e-3])
  assert grid.parse_axis("model.placement=pre_ln,deepnorm") == (
      "model.placement", ["pre_ln", "deepnorm"])
  for bad in ("optimizer.learning_rate", "=1,2", "train.seed=1,,2"):
    with pytest.raises(errors.UserError, match="is not of the form"):
      grid.parse_axis(bad)
  module = Experiment(axes={"train.seed": [0, 1], "optimizer.clip_norm": [1.0]})
  axes = grid.axes_of(module, ["train.seed=5,6,7"])
  assert axes == {"train.seed": [5, 6, 7], "optimizer.clip_norm": [1.0]}
  with pytest.raises(errors.UserError, match="repeats a value"):
    grid.axes_of(module, ["train.seed=1,1"])
  # Values are compared as values: 1 and 1.0 are one clip norm (they would name one run twice).
  with pytest.raises(errors.UserError, match="1 and 1.0 are the same optimizer.clip_norm"):
    grid.axes_of(module, ["optimizer.clip_norm=1,1.0"])
  with pytest.raises(errors.UserError, match="--axis=train.seed=... is given twice"):
    grid.axes_of(module, ["train.seed=1,2", "train.seed=3"])
  assert grid.file_axes(module, ["train.seed=5"]) == ["optimizer.clip_norm"]
  assert names.point_name({"optimizer.learning_rate": 0.001, "train.seed": 1}) == "lr0.001_seed1"
  assert names.point_name({"model.placement": "deepnorm"}) == "placement-deepnorm"


def test_grid_points_of_a_file_and_of_one_variant(tmp_path):
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")
  axes = {"optimizer.learning_rate": [1e-3, 1e-2], "train.seed": [0, 1]}
  one = grid.points(path, "post_norm_deepnorm_clip1", axes, {"train.num_steps": 7})
  assert [p.name for p in one] == ["lr0.001_seed0", "lr0.001_seed1", "lr0.01_seed0",
                                   "lr0.01_seed1"]
  assert all(p.config.train.num_steps == 7 and p.config.model.placement == "deepnorm"
             for p in one)
  assert one[3].config.optimizer.learning_rate == 0.01 and one[3].config.train.seed == 1
  assert one[3].point == {"optimizer.learning_rate": 0.01, "train.seed": 1}
  # Everything that makes the run, in the order it is applied: the command line's, the point's,
  # the label (the arm's plus the point).
  assert one[3].overrides == {"train.num_steps": 7, "optimizer.learning_rate": 0.01,
                              "train.seed": 1, "label": "{auto} | lr=0.01, seed=1"}
  assert one[3].spec == f"{path}:post_norm_deepnorm_clip1"
  every = grid.points(path, None, {"train.seed": [0, 1]}, {})
  assert [p.name for p in every][:3] == ["pre_norm_clip10/seed0", "pre_norm_clip10/seed1",
                                         "pre_norm_clip1/seed0"]
  assert len(every) == 8
  with pytest.raises(errors.ConfigError, match="unknown config field 'optimizer.lr'"):
    grid.points(path, "pre_norm_clip1", {"optimizer.lr": [1.0]}, {})
  # Values that differ but print alike would share a run directory: refused before anything.
  with pytest.raises(errors.UserError, match="would share the run directory 'lr0.000123457'"):
    grid.points(path, "pre_norm_clip1", {"optimizer.learning_rate": [1.2345671e-4,
                                                                      1.2345672e-4]}, {})
  # Arms that differ in data fields share a program; a structural axis splits them.
  assert len(planning.group_runs([grid.Run(p.name, p.config, "") for p in every])) == 3
  # A limit on runs per program splits a structure's runs into near-equal parts, in order.
  one_runs = [grid.Run(p.name, p.config, "") for p in one]
  assert [[r.name for r in g] for g in planning.group_runs(one_runs, max_runs=3)] == [
      ["lr0.001_seed0", "lr0.001_seed1"], ["lr0.01_seed0", "lr0.01_seed1"]]
  assert [len(g) for g in planning.group_runs(one_runs * 2, max_runs=3)] == [3, 3, 2]
  assert [len(g) for g in planning.group_runs(one_runs, max_runs=0)] == [4]


def test_a_sweep_of_the_seed_figure_takes_its_sweep_arms_and_settings():
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")
  module = grid.load_experiment(path)
  swept = grid.points(path, None, {"train.seed": [0]}, {"train.log_every": 7}, sweep=True)
  assert [p.arm for p in swept] == list(module.sweep_arms)  # the relax-DeepNorm one too
  assert len(module.sweep_arms) == 5 and len(module.study_arms) == 4
  for p in swept:
    # The experiment's settings apply, then the command line's overrides win.
    assert p.config.train.num_steps == module.settings["train.num_steps"]
    assert p.config.train.log_every == 7
  # A curve of a sweep is many runs: no "Run 1"/"Run 2" of the seed figure in its legend.
  assert [labels.resolve(p.config, template=p.arm_template) for p in swept][:2] == [
      "Pre-Norm | Gradient Clip=10", "Pre-Norm | Gradient Clip=1"]
  relax_deepnorm = swept[-1].config.model
  assert (relax_deepnorm.placement, relax_deepnorm.attention_relax) == ("deepnorm", 32.0)
  # A study of the file is its four arms with their recipe untouched.
  study = grid.points(path, None, {}, {})
  assert [p.arm for p in study] == list(module.study_arms)
  assert all(p.config.train.num_steps == 1000 for p in study)
  axes = grid.axes_of(module, [])
  assert len(axes["optimizer.learning_rate"]) >= 6 and len(axes["train.seed"]) >= 3
  assert min(axes["optimizer.learning_rate"]) <= 1e-3 and max(axes["optimizer.learning_rate"]) >= 0.3


def _tiny(config, tmp_path, steps=20):
  """`config` (a point of the seed figure's file) at the suite's size: one layer, for the
  reason tests/conftest.py's tiny_config gives."""
  config.model.update(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=16, vocab_size=32,
                      dtype="float32")
  config.train.update(batch_size=4, num_steps=steps, eval_every=10, eval_steps=2,
                      checkpoint_every=10, telemetry_every=5, tensorboard=False)
  config.data.update(data_dir=str(tmp_path / "tfds"), train_tokens=16384,
                     validation_tokens=4096)
  config.optimizer.warmup_steps = 3
  return config


@pytest.mark.slow
def test_each_run_of_a_sweep_equals_the_run_alone(tmp_path):
  # The orchestration path (records, run.json) in float32; every per-run field, float16's loss
  # scale among them, against the run alone is test_per_run.py's.
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")
  axes = {"optimizer.learning_rate": [1e-3, 1e-2], "train.seed": [0, 1]}
  points = grid.points(path, "pre_norm_clip1", axes, {})
  sweep_runs = []
  for p in points:
    with p.config.unlocked():
      _tiny(p.config, tmp_path)
    sweep_runs.append(grid.Run(p.name, p.config, str(tmp_path / "sweep" / p.name), p.arm,
                                      point=p.point))
  statuses = inprocess.train_programs(sweep_runs, str(tmp_path / "sweep"))
  assert statuses == {p.name: "finished" for p in points}
  for run in sweep_runs:
    alone = tmp_path / "alone" / run.name
    planning.train_and_evaluate(run.config, str(alone))
    swept, single = runs.trajectory(run.directory), runs.trajectory(alone)
    assert [r["step"] for r in swept] == list(range(1, 21))
    # Bit for bit: on the CPU the program's runs step one at a time through the one-run
    # program (normstudy.engine.execution), and the records hold float32 values exactly.
    assert swept == single, run.name
    info = rundir.RunDir(run.directory).info().as_json()
    assert info["arm"] == "pre_norm_clip1" and info["point"] == run.point
  # Different seeds and learning rates really gave different trajectories.
  finals = {runs.trajectory(r.directory)[-1]["loss"] for r in sweep_runs}
  assert len(finals) == 4


@pytest.mark.slow
def test_programs_of_one_structure_in_one_process_share_their_compiled_steps(tmp_path,
                                                                             monkeypatch):
  # A search trains each arm's program again every round; the process (or pool worker) keeps
  # the compiled steps by the program's structure (execution._program_key), so a program
  # of the same structure builds nothing, and records bit for bit what it records with steps
  # built afresh. A structural difference builds its own.
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")

  def program(root, learning_rates, **model):
    sweep_runs = []
    for p in grid.points(path, "pre_norm_clip1", {"optimizer.learning_rate": learning_rates,
                                                  "train.seed": [0, 1]}, {}):
      with p.config.unlocked():
        _tiny(p.config, tmp_path, steps=12)
        p.config.model.update(model)
        # Without telemetry (_tiny takes it every 5 steps): its program is one more
        # compilation a structure, and whether it is kept is the same rule.
        p.config.train.telemetry_every = 0
      sweep_runs.append(grid.Run(p.name, p.config, str(tmp_path / root / p.name), p.arm,
                                 point=p.point))
    return sweep_runs

  built = []
  monkeypatch.setattr(execution, "_build_steps", _counted(execution._build_steps, built))
  execution._KEPT.clear()
  inprocess.train_programs(program("first", [1e-3]), str(tmp_path / "first"))
  assert len(built) == 1
  kept = program("kept", [3e-3])
  inprocess.train_programs(kept, str(tmp_path / "kept"))
  assert len(built) == 1  # another learning rate: per-run data, the same program
  inprocess.train_programs(program("deeper", [3e-3], num_layers=2), str(tmp_path / "deeper"))
  assert len(built) == 2
  execution._KEPT.clear()
  fresh = program("fresh", [3e-3])
  inprocess.train_programs(fresh, str(tmp_path / "fresh"))
  assert len(built) == 3
  for a, b in zip(kept, fresh):
    assert runs.trajectory(a.directory) == runs.trajectory(b.directory), a.name
    assert len(runs.trajectory(a.directory)) == 12


def _counted(method, calls: list):
  def counted(*args, **kwargs):
    calls.append(1)
    return method(*args, **kwargs)
  return counted


def test_a_block_of_steps_ends_where_the_loop_must_act(make_config):
  # The rule, transcribed: update-size and telemetry steps alone; a block of at most 4 (or 1)
  # ends at an evaluation, a checkpoint or a run's last step, and before a step that goes alone.
  config = make_config()
  config.train.update(num_steps=30, steps_per_dispatch=4, telemetry_every=7, eval_every=10,
                      checkpoint_every=15, update_size_steps=2)
  last_steps = frozenset({24, 30})  # the rule reads only the configs' steps
  dispatches, step = [], 1
  while step <= 30:
    dispatches.append((step, schedule.dispatch_end(config.train, last_steps, step),
                       schedule.steps_alone(config.train, last_steps, step)))
    step = dispatches[-1][1] + 1
  alone, block = True, False
  assert dispatches == [
      (1, 1, alone), (2, 2, alone), (3, 6, block), (7, 7, alone), (8, 10, block),
      (11, 13, block), (14, 14, alone), (15, 15, block), (16, 19, block), (20, 20, block),
      (21, 21, alone), (22, 24, block), (25, 27, block), (28, 28, alone), (29, 30, block)]
  config.train.steps_per_dispatch = 1
  assert all(schedule.dispatch_end(config.train, last_steps, s) == s
             and schedule.steps_alone(config.train, last_steps, s) for s in range(1, 31))


@pytest.mark.slow
def test_steps_in_blocks_record_what_steps_one_at_a_time_record(tmp_path, monkeypatch):
  # float16 runs of one program: one learns, one skips overflowing steps until its loss scale
  # passes its floor and halts (each skip located); blocks of up to 4 steps (train.steps_per_
  # dispatch) between update-size steps, telemetry steps, evaluations and checkpoints, against
  # one step per dispatch. Compiled as a user's process compiles (tests/test_steps.py says why).
  from normstudy.engine import platform
  from conftest import USER_COMPILER_OPTIONS
  monkeypatch.setattr(platform, "CPU_COMPILER_OPTIONS",
                      {**platform.CPU_COMPILER_OPTIONS, **USER_COMPILER_OPTIONS})
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")
  trained = {}
  for per_dispatch in (1, 4):
    root = tmp_path / f"per_dispatch_{per_dispatch}"
    sweep_runs = []
    for p in grid.points(path, "pre_norm_clip1", {"optimizer.learning_rate": [1e-3, 1e3]}, {}):
      with p.config.unlocked():
        _tiny(p.config, tmp_path, steps=24)
        p.config.model.dtype = "float16"
        p.config.optimizer.clip_norm = 0.0
        p.config.optimizer.loss_scale.update(initial_scale=2.0**12, min_scale=2.0**9)
        p.config.train.update(telemetry_every=7, log_every=3, update_size_steps=2,
                              steps_per_dispatch=per_dispatch)
      sweep_runs.append(grid.Run(p.name, p.config, str(root / p.name), p.arm, point=p.point))
    blocks = []
    monkeypatch.setattr(execution.ProgramSteps, "step_block", _counted(
        execution.ProgramSteps.step_block, blocks))
    statuses = inprocess.train_programs(sweep_runs, str(root))
    assert statuses == {"lr0.001": "finished", "lr1000": "halted"}
    assert bool(blocks) == (per_dispatch > 1)
    trained[per_dispatch] = {
        run.name: (runs.trajectory(run.directory),
                   {k: v for k, v in rundir.RunDir(run.directory).info().as_json().items()
                    if k in ("status", "last_step", "halt_step", "halt_reason",
                             "nonfinite_at", "nonfinite_site")})
        for run in sweep_runs}
  halted = trained[4]["lr1000"][0]
  assert sum(1 for r in halted if r.get("skipped") and "nonfinite_at" in r) >= 2
  halt_step = trained[4]["lr1000"][1]["halt_step"]
  assert 2 < halt_step < 24 and halt_step % 7, "the halt is not inside a block: it tests less"
  assert trained[4] == trained[1]


@pytest.mark.slow
def test_a_run_that_halts_is_frozen_while_the_others_finish(tmp_path):
  path = os.path.join(runs.REPO, "configs", "seed_figure.py")
  axes = {"optimizer.learning_rate": [1e-3, 1e4]}
  sweep_runs = []
  for p in grid.points(path, "pre_norm_clip1", axes, {}):
    with p.config.unlocked():
      _tiny(p.config, tmp_path, steps=12)
      p.config.optimizer.clip_norm = 0.0
      p.config.train.on_nonfinite = "halt"
    sweep_runs.append(grid.Run(p.name, p.config, str(tmp_path / p.name), p.arm,
                                      point=p.point))
  statuses = inprocess.train_programs(sweep_runs, str(tmp_path))
  assert statuses == {"lr0.001": "finished", "lr10000": "halted"}
  halted = rundir.RunDir(str(tmp_path / "lr10000")).info().as_json()
  recs = runs.records(tmp_path / "lr10000")
  assert recs[-1]["step"] == halted["halt_step"] < 12 and recs[-1]["skipped"]
  assert halted["halt_reason"] == "non-finite gradient" and halted["nonfinite_at"]
  assert halted["halt_kind"] == "nonfinite"
  site = halted["nonfinite_site"]
  # The site's id (as telemetry sows it); the halt line's words derive from life's one table.
  words = schema.SITE_WORDS[site["site"]]
  assert set(site) == {"layer", "site"} and halted["nonfinite_at"].endswith(words)
  assert site["layer"] is None or halted["nonfinite_at"] == f"layer {site['layer']} {words}"
  assert [r["step"] for r in runs.records(tmp_path / "lr0.001")] == list(range(1, 13))


@pytest.mark.slow
def test_sweep_command_resumes_bit_exactly_after_sigkill(tmp_path):
  args = ("--config=configs/seed_figure.py:pre_norm_clip1",
          "--axis=optimizer.learning_rate=1e-3,3e-3", "--axis=train.seed=0,1",
          *runs.tiny_args(tmp_path / "tfds", num_steps=24, every=6),
          "--config.model.dropout=0.1", "--config.train.telemetry_every=4")
  reference = tmp_path / "reference"
  result = runs.run_module("normstudy.sweep", *args, f"--workdir={reference}")
  assert result.stdout.splitlines()[-1] == "runs: 4 finished"
  progress = [l for l in result.stderr.splitlines() if "runs alive" in l]
  assert progress and "loss best" in progress[-1] and "ETA" in progress[-1]
  sweep = json.loads((reference / "sweep.json").read_text())
  assert sweep["axes"] == {"optimizer.learning_rate": [0.001, 0.003], "train.seed": [0, 1]}
  assert [r["name"] for r in sweep["runs"]] == ["lr0.001_seed0", "lr0.001_seed1",
                                                "lr0.003_seed0", "lr0.003_seed1"]
  assert sweep["runs"][3]["point"] == {"optimizer.learning_rate": 0.003, "train.seed": 1}
  assert [r["status"] for r in sweep["runs"]] == ["finished"] * 4
  # Before training, the terminal says what will run.
  assert result.stdout.splitlines()[0].startswith(
      "grid: 1 arm(s) x optimizer.learning_rate (2: 0.001, 0.003; --axis) x train.seed (2: 0, 1; "
      "--axis) = 4 runs in 1 program(s)")
  # Every JSON file the sweep wrote is strict JSON (no NaN, no Infinity).
  for path in [*reference.rglob("*.json"), *reference.rglob("*.jsonl")]:
    for line in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
      json.loads(line, parse_constant=lambda name: pytest.fail(f"{path}: {name}"))
  # The notebook runs on the sweep in a fresh environment with only what its install cell
  # installs (and what Colab has).
  nb = fresh_env.execute_notebook(reference, tmp_path)
  text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
  assert "4 runs" in text
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) >= 5  # comparison, per-layer figures, overlay
  # Telemetry every 4 steps, in the records and the per-layer figures.
  recs = runs.records(reference / "lr0.001_seed0")
  assert [r["step"] for r in recs if "act_rms/layer_0" in r] == [4, 8, 12, 16, 20, 24]
  assert all("fp16_overflows" in r for r in recs if "act_rms/layer_0" in r)
  for metric in ("attn_logit_max", "act_rms", "grad_norm", "resid_absmax"):
    assert (reference / f"layers_{metric}.png").read_bytes().startswith(b"\x89PNG")
  killed = tmp_path / "killed"
  proc = runs.start_module("normstudy.sweep", *args, f"--workdir={killed}")
  first = killed / "lr0.003_seed1"
  if runs.wait_for_records(proc, first, 9):
    proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=runs.bound(120))
  runs.run_module("normstudy.sweep", *args, f"--workdir={killed}")
  for name in ("lr0.001_seed0", "lr0.001_seed1", "lr0.003_seed0", "lr0.003_seed1"):
    assert runs.trajectory(killed / name) == runs.trajectory(reference / name), name
  assert len(os.listdir(killed / "checkpoints")) == 1  # one stacked program


@pytest.mark.slow
def test_a_sweep_point_is_reproduced_by_the_command_sweep_json_gives(tmp_path):
  # The experiment's settings (warm-up 20, records every 5 steps) and its axis of seeds
  # apply besides the command line's axis: the listed overrides must carry all of them.
  data_dir = tmp_path / "tfds"
  args = ("--config=configs/seed_figure.py:pre_norm_clip1",
          "--axis=optimizer.learning_rate=1e-3,1e-2", *runs.TINY,
          f"--config.data.data_dir={data_dir}", "--config.train.num_steps=12",
          "--config.model.dtype=float32")
  swept = tmp_path / "sweep"
  runs.run_inline("normstudy.sweep", *args, "--axis=train.seed=0", f"--workdir={swept}")
  sweep = json.loads((swept / "sweep.json").read_text())
  assert sweep["settings"]["optimizer.warmup_steps"] == 20
  assert sweep["config"] == "configs/seed_figure.py:pre_norm_clip1"
  second = sweep["runs"][1]  # not the run the program's step was built from
  assert second["point"] == {"optimizer.learning_rate": 0.01, "train.seed": 0}
  assert second["overrides"]["optimizer.warmup_steps"] == 20
  argv = shlex.split(second["command"])
  assert argv[:3] == ["python", "-m", "normstudy.main"]
  alone = tmp_path / "alone"
  argv = [a if not a.startswith("--workdir=") else f"--workdir={alone}" for a in argv[3:]]
  runs.run_inline("normstudy.main", *argv)
  reproduced, original = runs.trajectory(alone), runs.trajectory(swept / second["name"])
  assert [r["step"] for r in reproduced] == [r["step"] for r in original]
  # The same run, bit for bit: losses, gradient norms, learning rates (warm-up 20 from
  # the experiment's settings: without it the run would differ from step 1) and eval losses.
  assert reproduced == original
  assert runs.read_json(alone / "run.json")["label"] == runs.read_json(
      swept / second["name"] / "run.json")["label"]


@pytest.mark.slow
def test_mesh_runs_shards_a_sweep_over_host_devices_from_the_command_line(tmp_path):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
  args = ("--config=configs/seed_figure.py:pre_norm_clip1", "--axis=train.seed=0,1",
          "--axis=optimizer.learning_rate=1e-3", *runs.tiny_args(tmp_path / "tfds", num_steps=4),
          "--config.mesh.runs=2", "--config.mesh.data=1", f"--workdir={tmp_path / 'wd'}")
  result = runs.run_module("normstudy.sweep", *args, env=env)
  assert "'runs': 2" in result.stderr  # the program's mesh put one run on each device
  for name in ("lr0.001_seed0", "lr0.001_seed1"):
    info = runs.read_json(tmp_path / "wd" / name / "run.json")
    assert (info["status"], info["last_step"]) == ("finished", 4)


@pytest.mark.slow
def test_sweep_arguments_that_clash_or_are_not_finite_are_refused_before_anything(tmp_path):
  workdir = tmp_path / "wd"
  base = ("--config=configs/seed_figure.py:pre_norm_clip1", f"--workdir={workdir}",
          *runs.tiny_args(tmp_path / "tfds"))
  # A --config.X that the experiment's axis would overwrite: one line naming both, exit 2.
  clash = runs.run_module("normstudy.sweep", *base, "--config.optimizer.learning_rate=-1e-3",
                          check=False)
  assert clash.returncode == 2 and "Traceback" not in clash.stderr
  assert ("--config.optimizer.learning_rate=-0.001 would be overwritten by the sweep's axis "
          "optimizer.learning_rate (the file's EXPERIMENT") in clash.stderr
  # A non-finite axis value: the field's one line.
  inf = runs.run_module("normstudy.sweep", *base, "--axis=optimizer.learning_rate=1e999,1e-3",
                        check=False)
  assert inf.returncode == 2 and "Traceback" not in inf.stderr
  assert "config.optimizer.learning_rate=inf is not allowed; allowed: a finite number" in inf.stderr
  assert not workdir.exists()
  # A --workdir that is a file is reported as itself, not under a run's subdirectory.
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  on_file = runs.run_module("normstudy.sweep", *base, f"--workdir={a_file}", check=False)
  assert on_file.returncode == 2
  assert on_file.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={str(a_file)!r} exists and is not a directory")
  # The usage line reads as a command: a continuation, then the next line.
  usage = runs.run_module("normstudy.sweep", "--help").stdout.splitlines()
  first = next(i for i, line in enumerate(usage) if "python -m normstudy.sweep" in line)
  assert usage[first].endswith("--workdir=DIR \\") and usage[first + 1].strip().startswith(
      "--axis=optimizer.learning_rate=")
  # A bug in the user's own get_config is shown with its place, not as a bare 'v'.
  buggy = tmp_path / "buggy.py"
  buggy.write_text("from normstudy.core import config\n\n\ndef get_config(arg=None):\n"
                   "  table = {}\n  return table['v']\n")
  broken = runs.run_module("normstudy.main", f"--config={buggy}", f"--workdir={workdir}",
                           check=False)
  assert broken.returncode == 2 and "Traceback" not in broken.stderr
  assert f"KeyError 'v' in {os.path.relpath(buggy, runs.REPO)}:6 (get_config)" in broken.stderr


@pytest.mark.slow
def test_sigterm_to_a_sweep_in_one_process_records_its_runs_as_preempted(tmp_path):
  args = ("--config=configs/seed_figure.py:pre_norm_clip1",
          "--axis=model.placement=pre_ln,post_ln", "--axis=train.seed=0",
          "--axis=optimizer.learning_rate=1e-3", "--workers=1",
          *runs.tiny_args(tmp_path / "tfds", num_steps=400, every=100),
          "--config.train.telemetry_every=0", f"--workdir={tmp_path / 'sweep'}")
  proc = runs.start_module("normstudy.sweep", *args)
  assert runs.wait_for_records(proc, tmp_path / "sweep" / "lr0.001_seed0_placement-pre_ln", 3)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=runs.bound(120))
  assert proc.returncode == 0, stderr[-3000:]
  assert re.match(r"preempted: SIGTERM at step \d+", stderr.strip().splitlines()[-1])
  # sweep.json says so (it once stayed at "running"); the program not started stays unrun.
  sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
  statuses = {r["name"]: r["status"] for r in sweep["runs"]}
  assert statuses["lr0.001_seed0_placement-pre_ln"] == "preempted"
  assert runs.read_json(tmp_path / "sweep" / "lr0.001_seed0_placement-pre_ln" / "run.json")[
      "status"] == "preempted"


@pytest.mark.slow
def test_shares_of_a_grid_trained_apart_equal_the_sweep_trained_whole(tmp_path):
  args = ("--config=configs/seed_figure.py:pre_norm_clip1",
          "--axis=model.placement=pre_ln,post_ln,sandwich_ln", "--axis=train.seed=0",
          "--axis=optimizer.learning_rate=1e-3", "--workers=1",
          *runs.tiny_args(tmp_path / "tfds", num_steps=6, every=3),
          "--config.train.telemetry_every=0")
  whole = tmp_path / "whole"
  runs.run_inline("normstudy.sweep", *args, f"--workdir={whole}")
  shared = tmp_path / "shared"
  first = runs.run_inline("normstudy.sweep", *args, f"--workdir={shared}", "--programs=1/2")
  assert "share 1/2: programs 1, 3" in first.stdout
  assert first.stdout.splitlines()[-1] == "share 1/2: runs 2 finished"
  assert not (shared / "sweep.json").exists()  # the whole sweep's, afterwards
  second = runs.run_inline("normstudy.sweep", *args, f"--workdir={shared}", "--programs=2/2")
  assert "share 2/2: programs 2" in second.stdout
  # The sweep run whole afterwards trains nothing and writes the record and the analysis.
  last = runs.run_inline("normstudy.sweep", *args, f"--workdir={shared}")
  assert last.stdout.splitlines()[-1] == "runs: 3 finished"
  assert "finished earlier, skipped" in last.stderr
  names = [r["name"] for r in json.loads((whole / "sweep.json").read_text())["runs"]]
  assert len(names) == 3
  for name in names:
    assert runs.trajectory(shared / name) == runs.trajectory(whole / name), name
  bad = runs.run_inline("normstudy.sweep", *args, f"--workdir={tmp_path / 'never'}",
                        "--programs=3/2", check=False)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
      "error: --programs=3/2 is not allowed; allowed: I/N with 1 <= I <= N, e.g. "
      "--programs=2/8 (the second of 8 shares)")
  assert not (tmp_path / "never").exists()


def _fake_group(runs_, steps):
  from types import SimpleNamespace
  return [SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(num_steps=steps)))] * runs_


def test_the_sweep_wide_line_counts_the_runs_of_the_programs_that_finished():
  """Once counted the first programs' runs whatever finished (issue 45: 'programs 1/3 done,
  runs 2/4' when the finished program had 1 run)."""
  from normstudy.experiments import planning
  calls = [(i, 3, _fake_group(size, 10), "w") for i, size in ((1, 2), (2, 1), (3, 1))]
  progress = planning._OverallProgress(calls)
  for i in range(3):
    progress.start(i)
  assert "programs 1/3 done, runs 1/4 " in progress.done(2)  # the third, of one run, first
  assert "programs 2/3 done, runs 3/4 " in progress.done(0)
  assert "programs 3/3 done, runs 4/4 " in progress.done(1)


def test_a_first_estimate_comes_with_the_first_steady_rate_before_any_program_finishes():
  """Issue 88, item 17: a study gave no ETA for the whole until its first program finished. The
  first steady rate any program measures gives one estimate of the whole: every program's
  run-steps at that rate over the programs side by side; once, and never after a program has
  finished (the sweep-wide ETA takes over) or for a single program."""
  from normstudy.experiments import planning
  calls = [(i, 4, _fake_group(3, 1000), "w") for i in range(1, 5)]  # 12,000 run-steps
  progress = planning._OverallProgress(calls, workers=2)
  progress.start(0), progress.start(1)
  line = progress.rate(1, 0.005)  # 5 ms a run-step, 2 at a time: 30 s
  assert line.startswith("[sweep] first estimate: about 30s to train its 4 programs (12,000 "
                         "run-steps at program 2's steady 5 ms a run-step, 2 at a time)")
  assert progress.rate(0, 0.001) is None  # once
  later = planning._OverallProgress(calls, workers=2)
  later.start(0), later.done(0)
  assert later.rate(1, 0.005) is None
  alone = planning._OverallProgress(calls[:1])
  assert alone.rate(0, 0.005) is None


def test_a_programs_first_steady_rate_is_told_once_per_program(monkeypatch):
  """The train loop's Progress tells the listener its first steady seconds per run-step (its
  runs together): 0.1 s a step of 4 runs is 0.025 s a run-step."""
  from types import SimpleNamespace
  from normstudy.engine import logs
  from normstudy.engine import recorder
  at = [0.0]
  monkeypatch.setattr(recorder.time, "perf_counter", lambda: at[0])
  heard = []
  with logs.rates_to(heard.append):
    progress = recorder.Progress([SimpleNamespace(name=n) for n in "abcd"], 0, 100)
    for step, now in ((1, 50.0), (2, 50.1), (5, 50.4), (10, 50.9), (20, 51.9)):
      at[0] = now
      progress.report(step, {}, {})
  assert heard == [pytest.approx(0.025)]


@pytest.mark.parametrize("workers, compile_s", [(1, 0.0), (2, 213.0), (2, 20.0), (4, 120.0)])
def test_the_sweep_eta_is_within_30_percent_once_a_tenth_is_done(monkeypatch, workers,
                                                                  compile_s):
  """Issue 78, item 15: a sweep's ETA said 5,184 s when it ended 14 minutes later. On a
  simulated clock, a pool of `workers` hands programs of 1-4 runs out in order; a program takes
  0.05 s a run-step (+-15%, seeded) plus, on a worker's first program, `compile_s` of
  compiling (later ones 1 s: the worker keeps its compiled steps). Every sweep-wide line once
  a tenth of the run-steps is done gives an ETA within 30% of the time left (3% of the sweep
  in its last seconds), the last one 0;
  the formula before (time so far over runs done) misses by more in the pooled cases."""
  import random
  from normstudy.experiments import planning
  rng = random.Random(7)
  sizes = [rng.choice((1, 2, 2, 4)) for _ in range(24)]
  steps = 400
  calls = [(i + 1, len(sizes), _fake_group(size, steps), "w") for i, size in enumerate(sizes)]
  free = [0.0] * workers
  events, used = [], set()
  for i, size in enumerate(sizes):  # the pool: each program to the worker that frees first
    worker = min(range(workers), key=lambda w: free[w])
    compiled = compile_s if worker not in used else 1.0
    used.add(worker)
    took = size * steps * 0.05 * rng.uniform(0.85, 1.15) + compiled
    events += [(free[worker], 1, "start", i, worker, compiled),
               (free[worker] + took, 0, "done", i, worker, compiled)]
    free[worker] += took
  end = max(free)
  clock = {"now": 0.0}
  monkeypatch.setattr(planning.time, "perf_counter", lambda: clock["now"])
  progress = planning._OverallProgress(calls, workers)
  total, done_work, checked, old_misses = sum(sizes) * steps, 0, 0, 0
  for at, _, kind, i, worker, compiled in sorted(events):
    clock["now"] = at
    if kind == "start":
      progress.start(i, worker)
      continue
    line = progress.done(i, compiled)
    done_work += sizes[i] * steps
    eta = float(line.rsplit("ETA ", 1)[1].rstrip("s"))
    left = end - at
    runs_done = sum(sizes[j] for j in progress.finished)
    old_eta = at / runs_done * (sum(sizes) - runs_done)
    if left == 0:
      assert eta == 0, line
    elif done_work >= total / 10:
      checked += 1
      # Within 30% of the time left; in the last seconds, whose 30% is less than one
      # program's own spread (+-15%), within 3% of the sweep.
      assert abs(eta - left) <= max(0.3 * left, 0.03 * end), (line, left)
      old_misses += abs(old_eta - left) > max(0.3 * left, 0.03 * end)
  assert checked >= 15
  if workers > 1:
    assert old_misses > 0


@pytest.mark.parametrize("field, value, shape", [
    ("axes", '["optimizer.learning_rate"]', "is not {dotted.field: [value, ...]}"),
    ("axes", '{"train.seed": 3}', "is not {dotted.field: [value, ...]}"),
    ("arms", '{"a": {"model.placement": "post_ln"}}',
     "is not {name: (label, {dotted.field: value})}"),
    ("sweep_arms", '"pre_norm_clip1"', "is not a list of its arms' names"),
    ("sweep_arms", '("pre_norm_clip2",)', "names pre_norm_clip2, not among its arms"),
    ("default_arm", '"pre_norm_clip2"', "default_arm names pre_norm_clip2, not among its arms"),
    ("settings", '[("train.num_steps", 5)]', "is not {dotted.field: value}"),
    ("report", '"figure"', "report='figure' is not allowed"),
    ("base", 'None', "declares no base config"),
])
def test_a_malformed_experiment_in_a_config_file_is_one_line(tmp_path, field, value, shape):
  """Once an AttributeError traceback after the plan (issue 45)."""
  from normstudy import errors
  path = tmp_path / "bad.py"
  path.write_text("import dataclasses\nfrom configs import seed_figure\n"
                  f"EXPERIMENT = dataclasses.replace(seed_figure.EXPERIMENT, {field}={value})\n"
                  "get_config = EXPERIMENT.get_config\n")
  with pytest.raises(errors.UserError) as refused:
    grid.load_experiment(str(path))
  assert str(refused.value).startswith(f"{path}: ") and shape in str(refused.value)
  assert "\n" not in str(refused.value)


def test_a_config_file_without_an_experiment_is_one_line(tmp_path):
  """A file of the older module tables (or none): what to declare instead, naming the file."""
  path = tmp_path / "old.py"
  path.write_text("from configs.seed_figure import get_config\nVARIANTS = {}\n")
  refused = runs.run_inline("normstudy.sweep", f"--config={path}", f"--workdir={tmp_path / 'w'}",
                            check=False)
  assert refused.returncode == 2 and not (tmp_path / "w").exists()
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: {path} exports no EXPERIMENT (a normstudy.core.experiment.Experiment): a config "
      "file declares what it runs there, and `get_config = EXPERIMENT.get_config`; "
      "configs/seed_figure.py shows both")


def test_the_config_file_is_loaded_once(tmp_path):
  """A sweep reads its file's EXPERIMENT from the module the --config flag loaded, rather than
  running the file a second time (a file with side effects, or a slow one, runs once)."""
  log = tmp_path / "loads.txt"
  config = tmp_path / "counted.py"
  config.write_text(
      "import os\n"
      f"with open({str(log)!r}, 'a') as f:\n"
      "  f.write('loaded\\n')\n"
      "import dataclasses\n"
      "from configs import seed_figure\n"
      "EXPERIMENT = dataclasses.replace(seed_figure.EXPERIMENT, axes={'train.seed': [0, 1]})\n"
      "get_config = EXPERIMENT.get_config\n")
  result = runs.run_inline("normstudy.sweep", f"--config={config}",
                           f"--workdir={tmp_path / 'w'}", "--max_runs_per_program=-1",
                           check=False)
  assert result.returncode == 2 and "--max_runs_per_program=-1" in result.stderr
  assert log.read_text().splitlines() == ["loaded"]


@pytest.mark.slow
def test_a_declared_experiment_runs_whole_from_its_file_and_is_recorded(tmp_path):
  """Issue 77: `normstudy.sweep --config=FILE --workdir=DIR` runs what the file's EXPERIMENT
  declares (its search with its rounds, then its part into DIR/<part>, then the analysis of DIR
  with the part's runs), sweep.json records the experiment whole, and the analysis writes the
  report it names."""
  config = tmp_path / "declared.py"
  config.write_text(textwrap.dedent("""
      from configs import seed_figure
      from normstudy.core.experiment import Experiment, Part, Search

      ARMS = {name: seed_figure.EXPERIMENT.arms[name]
              for name in ("pre_norm_clip1", "post_norm_deepnorm_clip1")}
      EXPERIMENT = Experiment(
          base=seed_figure.base_config, arms=ARMS, axes={"train.seed": [0]},
          settings={"label": "{auto}"},
          search=Search("optimizer.learning_rate", 0.01, 100.0, rounds=1),
          parts={"learning": Part(axes={"optimizer.learning_rate": [0.003],
                                        "train.seed": [0]})},
          report="critical learning rate by search")
      get_config = EXPERIMENT.get_config
      """))
  workdir = tmp_path / "w"
  runs.run_inline("normstudy.sweep", f"--config={config}", f"--workdir={workdir}",
                  *runs.tiny_args(tmp_path / "tfds", num_steps=6), "--workers=1")
  from normstudy.experiments import grid
  declared = grid.load_experiment(str(config))
  record = json.loads((workdir / "sweep.json").read_text())
  assert record["experiment"] == declared.as_json()
  assert record["search"]["rounds"] == 1  # the file's, not the flag's default
  assert record["search"]["field"] == "optimizer.learning_rate"
  part = json.loads((workdir / "learning" / "sweep.json").read_text())
  assert part["experiment"] == {**declared.as_json(), "part": "learning"}
  assert part["axes"] == {"optimizer.learning_rate": [0.003], "train.seed": [0]}
  assert (workdir / "critical_lr.csv").is_file()  # the declared report
  # The analysis of DIR holds the part's runs (the recipe's rate, which the search never tried).
  assert "0.003" in (workdir / "runs.csv").read_text()
  assert not (workdir / "learning" / "critical_lr.csv").exists()  # a part: by its data


def test_a_grid_of_a_seed_figure_arm_is_no_single_run_in_its_labels(tmp_path):
  """Issue 88, item 19: runs of a user's sweep were labelled "... | Run 2" (MERT's legend for its
  one Pre-Norm clip 1 run) whatever their seed; a grid's point names the run. A user's own file
  whose config keeps the seed figure's label, swept over seeds."""
  from normstudy.experiments import grid
  own = tmp_path / "mine.py"
  own.write_text("from configs import seed_figure\n"
                 "from normstudy.core.experiment import Experiment\n"
                 "EXPERIMENT = Experiment(base=lambda: seed_figure.get_config('pre_norm_clip1'))\n"
                 "get_config = EXPERIMENT.get_config\n")
  runs_ = grid.points(str(own), None, {"train.seed": [0, 1]}, {}, sweep=True, workdir="w")
  assert [r.config.label for r in runs_] == ["{auto} | seed=0", "{auto} | seed=1"]
  assert all("Run" not in r.arm_label for r in runs_)
  from configs import seed_figure
  assert seed_figure.get_config("pre_norm_clip1").label == "{auto} | Run 2"  # the figure's own

"""Reliability: bit-exact resume after SIGKILL, clean preemption, non-finite steps, damaged
checkpoints, bad input, workdir safety, torn records. Processes are real subprocesses."""

import errno
import json
import os
import shutil
import signal
import sys
import time

import pandas as pd
import pytest

from normstudy import errors
from normstudy.core import config as config_lib
from normstudy.core import layers
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import per_run
from normstudy.core import placements
from normstudy.experiments import validation
from normstudy.records import metrics as metrics_lib
from normstudy.records import rundir
from normstudy.records import schema
import runs

SEED = "configs/seed_figure.py:pre_norm_clip1"
LM = "configs/lm.py:tiny"


def _args(tmp_path, num_steps, every=5, extra=()):
  return (*runs.tiny_args(tmp_path / "tfds", num_steps=num_steps, every=every),
          "--config.model.dropout=0.1", *extra)


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume_is_bit_exact(tmp_path):
  args = _args(tmp_path, num_steps=40)
  reference = tmp_path / "reference"
  runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={reference}", *args)
  killed = tmp_path / "killed"
  kills = 0
  for kill_at in (8, 19, 33):
    proc = runs.start_module("normstudy.main", f"--config={SEED}", f"--workdir={killed}", *args)
    if runs.wait_for_records(proc, killed, kill_at):
      proc.send_signal(signal.SIGKILL)
      kills += 1
    proc.communicate(timeout=runs.bound(120))
  assert kills >= 2  # the run was really interrupted mid-way
  runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={killed}", *args)
  expected = runs.trajectory(reference)
  assert [r["step"] for r in expected] == list(range(1, 41))
  assert runs.trajectory(killed) == expected


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_current_step_and_exits_cleanly(tmp_path, signum):
  workdir = tmp_path / "run"
  args = (f"--config={LM}", f"--workdir={workdir}",
          *runs.tiny_args(tmp_path / "tfds", num_steps=400, every=1000))
  proc = runs.start_module("normstudy.main", *args)
  assert runs.wait_for_records(proc, workdir, 5)
  sent = time.time()
  proc.send_signal(signum)
  _, stderr = proc.communicate(timeout=runs.bound(60))
  assert time.time() - sent < 20
  assert proc.returncode == 0, stderr[-2000:]
  assert f"preempted: {signal.Signals(signum).name} at step" in stderr
  assert "Traceback" not in stderr
  recs = runs.records(workdir)
  last = recs[-1]["step"]
  assert 5 <= last < 400
  assert sorted(os.listdir(workdir / "checkpoints")) == [str(last)]
  runs.run_module("normstudy.main", *args)
  assert [r["step"] for r in runs.records(workdir)] == list(range(1, 401))


@pytest.mark.slow
def test_nonfinite_halt_skip_and_fp16_scale_floor(tmp_path):
  diverge = ("--config.optimizer.learning_rate=1e30", "--config.optimizer.clip_norm=0",
             "--config.optimizer.warmup_steps=0")
  base = runs.tiny_args(tmp_path / "tfds", num_steps=20, every=1)
  halted = runs.run_inline("normstudy.main", f"--config={LM}", f"--workdir={tmp_path / 'halt'}",
                           *base, *diverge, check=False)
  assert halted.returncode == 3
  lines = [l for l in halted.stderr.splitlines() if l.startswith("halted:")]
  assert len(lines) == 1 and "non-finite gradient at step 2" in lines[0]
  assert "on_nonfinite=halt" in lines[0] and "Traceback" not in halted.stderr
  assert "; first non-finite: " in lines[0]
  assert "newest checkpoint (step 1)" in lines[0]
  assert sorted(os.listdir(tmp_path / "halt" / "checkpoints")) == ["1"]

  skipped = runs.run_inline(
      "normstudy.main", f"--config={LM}", f"--workdir={tmp_path / 'skip'}", *base, *diverge,
      "--config.train.on_nonfinite=skip", "--config.train.max_consecutive_skips=3", check=False)
  assert skipped.returncode == 3
  assert "4 consecutive skipped updates" in skipped.stderr
  recs = runs.records(tmp_path / "skip")
  assert [r["skipped"] for r in recs] == [False, True, True, True, True]
  assert recs[-1]["skipped_total"] == 4

  fp16 = runs.run_inline(
      "normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'fp16'}", *base,
      "--config.optimizer.loss_scale.initial_scale=1e30",
      "--config.optimizer.loss_scale.min_scale=1e29", check=False)
  assert fp16.returncode == 3
  assert "with the loss scale at its minimum" in fp16.stderr
  scales = [r["loss_scale"] for r in runs.records(tmp_path / "fp16")]
  assert scales[0] == pytest.approx(1e30, rel=1e-6) and scales[1] == pytest.approx(5e29, rel=1e-6)


def _corrupt(step_dir):
  """Truncates every array file of a checkpoint's state."""
  damaged = 0
  for root, _, files in os.walk(step_dir / "state"):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 0 and "d/" in path.replace(os.sep, "/") + "/":
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 3)
        damaged += 1
  assert damaged, f"no array files found under {step_dir}"


def _tree_listing(path):
  """Every file with its size, but the libraries' log, which each process that trains here
  appends to (a refused resume's orbax lines included), and the lock's size: each process that
  takes the lock writes its pid there, one digit longer past pid 9999 (a clean clone's CI run
  met it)."""
  return sorted((os.path.relpath(os.path.join(r, f), path),
                 None if f == schema.LOCK else os.path.getsize(os.path.join(r, f)))
                for r, _, files in os.walk(path) for f in files
                if os.path.join(r, f) != os.path.join(path, schema.LIBRARY_LOG))


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_then_all_damaged_stops(tmp_path):
  workdir = tmp_path / "run"
  common = (f"--config={LM}", f"--workdir={workdir}", "--config.train.max_to_keep=3")
  runs.run_inline("normstudy.main", *common, *runs.tiny_args(tmp_path / "tfds", 6, every=2))
  reference = runs.trajectory(workdir)
  _corrupt(workdir / "checkpoints" / "6")
  resumed = runs.run_inline("normstudy.main", *common,
                            *runs.tiny_args(tmp_path / "tfds", 6, every=2))
  warning = [l for l in resumed.stderr.splitlines() if "cannot be restored" in l]
  assert len(warning) == 1 and "the checkpoint of step 6 in" in warning[0]
  assert len(warning[0]) < 500 and "bound method" not in warning[0]
  assert "resumed" in resumed.stderr and "at step 4" in resumed.stderr
  assert runs.trajectory(workdir) == reference  # steps 5 and 6 recomputed identically
  assert (workdir / "checkpoints_damaged" / "6").is_dir()

  for step in os.listdir(workdir / "checkpoints"):
    if step.isdigit():
      _corrupt(workdir / "checkpoints" / step)
  before = _tree_listing(workdir)
  failed = runs.run_inline("normstudy.main", *common,
                           *runs.tiny_args(tmp_path / "tfds", 8, every=2), check=False)
  assert failed.returncode == 2
  assert "no checkpoint under" in failed.stderr and "left untouched" in failed.stderr
  assert "Traceback" not in failed.stderr
  assert _tree_listing(workdir) == before


def _allowed(names):
  return "allowed: " + ", ".join(names)


BAD_VALUES = [
    ("model.placement", "not_a_placement", _allowed(placements.names())),
    ("model.norm", "batchnorm", _allowed(layers.NORMS.names())),
    ("model.activation", "swish", _allowed(layers.ACTIVATIONS.names())),
    ("optimizer.name", "sgd", _allowed(optimizer_lib.OPTIMIZERS.names())),
    ("model.dtype", "float64", "allowed: float32, bfloat16, float16"),
    ("model.init", "he", "allowed: xavier, bert"),
    ("model.attention_relax_form", "late", "allowed: pb_relax, after_product"),
    ("model.attention_kernel", "flash", "allowed: xla, cudnn"),
    ("data.name", "no_such_dataset", "allowed: synthetic, text_files, shakespeare, kjv or a TFDS catalog"),
    ("optimizer.schedule", "step", "allowed: constant, cosine, linear, polynomial"),
    ("model.num_heads", 5, "does not divide config.model.d_model=128"),
    ("optimizer.clip_norm", -1.0, "None or 0 (off), or a number > 0"),
    ("optimizer.learning_rate", 0.0, "a number > 0"),
    ("train.batch_size", 0, "an integer >= 1"),
    # Issue 78: once a 65-line OverflowError from core/per_run.py.
    ("train.num_steps", 99999999999999999999999, "an integer >= 1, below 2^31"),
    ("train.max_consecutive_skips", 2**31, "below 2^31 (a run counts in 32-bit integers)"),
    ("model.attention_relax", -1.0, "0 (off) or a number > 0"),
    ("data.mask_prob", 1.5, "a number in [0, 1]"),
    ("train.on_nonfinite", "retry", "allowed: halt, skip"),
    ("train.seed", -1, "an integer in [0, 2^31)"),  # once grain's traceback, checkpoints/ made
    ("data.seed", -1, "an integer in [0, 2^31)"),  # once "expected non-negative integer"
    ("train.eval_seed", -2, "-1 (each run's own train.seed) or an integer >= 0"),
    ("model.max_len", 100000, "allowed: max_len <= 65536, or more validation_tokens"),
    ("data.dialects", 193, "allowed: at most 192 (three quarters"),  # once a ZeroDivisionError
    ("label", "{no.such.field}", "{no.such.field} is not a config field; allowed: {auto} or"),
    ("label", "{optimizer.learning_rate:q}",
     "the format 'q' does not apply to config.optimizer.learning_rate=0.001"),
    # Once literal labels or a 15-line YAML one (issue 45).
    ("label", "{}", "a '{' that is not part of a {field}; allowed: {auto} or"),
    ("label", "{0}", "a '{' that is not part of a {field}"),
    ("label", "{auto", "a '{' that is not part of a {field}"),
    ("label", "{auto} | x}", "a '}' that is not part of a {field}"),
    ("label", "{optimizer.learning_rate!r}", "a '{' that is not part of a {field}"),
    ("label", "{optimizer}", "{optimizer} is a section, not a field"),
]


@pytest.mark.parametrize("field,value,allowed", BAD_VALUES)
def test_validate_names_field_value_and_allowed(field, value, allowed):
  config = config_lib.default_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(errors.ConfigError) as e:
    validation.validate(config)
  assert str(e.value).startswith(f"config.{field}={value!r}")
  assert allowed in str(e.value)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("field,value,message", [
    ("model.attention_relax", 32.0, "config.model.attention_relax=32.0 changes the attention "
     "scores, which config.model.attention_kernel='cudnn' never writes out; allowed with cudnn: "
     "0.0, or attention_kernel='xla'"),
    ("model.attn_softcap", 30.0, "config.model.attn_softcap=30.0 changes the attention scores"),
    ("model.qk_clip", 100.0, "config.model.qk_clip=100.0 changes the attention scores"),
    ("model.attention_scores_dtype", "float32",
     "config.model.attention_scores_dtype='float32' changes the attention scores"),
    ("model.attention", "none", "config.model.attention_kernel='cudnn' computes attention; "
     "config.model.attention='none' has none; allowed: attention_kernel='xla'"),
    ("model.dtype", "float32", "config.model.dtype='float32': config.model.attention_kernel="
     "'cudnn' runs in bfloat16 only"),
    # Its scores accumulate in float32: float16's score overflow, the study's object, would vanish.
    ("model.dtype", "float16", "config.model.dtype='float16': config.model.attention_kernel="
     "'cudnn' runs in bfloat16 only (in float16 its float32 scores could not overflow as "
     "float16 attention does); allowed: 'bfloat16', or attention_kernel='xla'"),
])
def test_the_fused_attention_kernel_refuses_what_needs_the_scores(field, value, message):
  """model.attention_kernel='cudnn' computes softmax(q k^T / sqrt(d)) v in one kernel: whatever
  reads or changes the scores, and a dtype other than bfloat16, is refused in one line rather
  than ignored."""
  config = config_lib.default_config()
  config.model.update(attention_kernel="cudnn", dtype="bfloat16")
  validation.validate(config)  # the plain model is allowed
  section, _, name = field.rpartition(".")
  config[section][name] = value
  with pytest.raises(errors.ConfigError) as e:
    validation.validate(config)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_tokenizer_for_text_files_is_refused_not_ignored():
  config = config_lib.default_config()
  config.data.update(name="text_files", files="*.txt", tokenizer="missing.model")
  config.model.vocab_size = 256
  with pytest.raises(errors.ConfigError, match="config.data.tokenizer='missing.model' applies "
                     "to TFDS catalog datasets; text_files are read as byte-level tokens"):
    validation.validate(config)


def test_synthetic_split_sizes_follow_the_generator():
  from normstudy.data import sources as data_lib
  from normstudy.data import synthetic
  for requested in (1, 10, 4096, 4097, 2**16):
    docs = max(1, -(-requested // synthetic.DOC_LENGTH))
    assert data_lib.synthetic_tokens(requested) == docs * synthetic.DOC_LENGTH


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    ((f"--config={SEED}", "--config.model.placement=not_a_placement"),
     "config.model.placement='not_a_placement' is not allowed; " + _allowed(placements.names())),
    (("--config=configs/seed_figure.py:nope",), "unknown variant 'nope'"),
    (("--config=configs/missing.py",), "config file 'configs/missing.py' does not exist"),
    ((f"--config={SEED}", "--config.model.colour=3"), "unknown config field 'colour'"),
    ((f"--config={SEED}", "--config.modell.x=3"),
     "unknown config field 'modell' (--config.modell.x=3); did you mean 'model'?"),
    ((f"--config={SEED}", "--config.train.batch_size=0"), "config.train.batch_size=0"),
    # Checked before the workdir is made (each once wrote it, and its lock, or a traceback).
    ((f"--config={SEED}", "--config.train.seed=-1"), "config.train.seed=-1 is not allowed"),
    ((f"--config={SEED}", "--config.label={no.such.field}"),
     "config.label='{no.such.field}': {no.such.field} is not a config field"),
    ((f"--config={SEED}", "--config.data.data_dir=/proc/nope/tfds"),
     "config.data.data_dir='/proc/nope/tfds' cannot be created"),
    ((f"--config={SEED}", "--config.data.name=text_files", "--config.model.vocab_size=256",
      "--config.data.files=/nonexistent/*.txt"),
     "config.data.files='/nonexistent/*.txt' matches no file"),
    # Plain words, not Python's (each once read as below).
    (("--config=configs",), "config file 'configs' is a directory"),  # "does not exist"
    (("--config=configs/__init__.py",),  # "unknown config field 'get_config'"
     "config file 'configs/__init__.py' defines no get_config()"),
    ((f"--config={SEED}", "--config.train.num_steps=2.5"),  # "invalid literal for int() ..."
     "--config.train.num_steps=2.5 is not allowed; allowed: an integer"),
    # Issue 78: once a 65-line OverflowError from core/per_run.py.
    ((f"--config={SEED}", "--config.train.num_steps=99999999999999999999999"),
     "config.train.num_steps=99999999999999999999999 is not allowed; allowed: an integer >= 1, "
     "below 2^31"),
    ((f"--config={SEED}", "--config.train.tensorboard=maybe"),  # "('Non-boolean argument ..."
     "--config.train.tensorboard=maybe is not allowed; allowed: true or false"),
    ((f"--config={SEED}", "--config.model.attention_kernel=cudnn",
      "--config.model.dtype=bfloat16"),
     "config.model.attention_kernel='cudnn' needs a GPU; these devices are cpu; allowed here: "
     "'xla'"),
])
def test_bad_command_line_is_one_line_and_creates_nothing(tmp_path, args, message):
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.main", *args, f"--workdir={workdir}", check=False)
  _assert_one_line(result, message, workdir)


@pytest.mark.parametrize("args,message", [
    # Issue 78: each once in Python's words ("... of original type <class 'str'> and cannot be
    # casted to type <class 'float'>", "could not convert string to float: 'None'").
    (("--axis=optimizer.learning_rate=abc,def",),
     "config.optimizer.learning_rate='abc' is not allowed; allowed: a number"),
    (("--axis=model.num_layers=1.5,2",),
     "config.model.num_layers=1.5 is not allowed; allowed: an integer"),
    (("--axis=train.seed=0,1", "--config.optimizer.learning_rate=None"),
     "--config.optimizer.learning_rate=None is not allowed; allowed: a number"),
])
def test_a_sweep_value_of_the_wrong_type_is_one_plain_line(tmp_path, args, message):
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.sweep", f"--config={SEED}", *args, f"--workdir={workdir}",
                           check=False)
  _assert_one_line(result, message, workdir)


@pytest.mark.slow
def test_config_files_and_workdirs_that_cannot_be_used_are_one_line(tmp_path):
  none = tmp_path / "none.py"
  none.write_text("def get_config(variant=None):\n  return None\n")
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.main", f"--config={none}", f"--workdir={workdir}",
                           check=False)  # once "--config=None: Flag --config must have ..."
  _assert_one_line(result, f"get_config() of '{none}' returned None", workdir)
  link = tmp_path / "link"
  link.symlink_to(tmp_path / "nowhere")
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={link}",
                           check=False)  # once "[Errno 17] File exists"
  _assert_one_line(result, f"--workdir='{link}' is a symlink to '{tmp_path / 'nowhere'}', "
                   "which does not exist", tmp_path / "nowhere")


def test_integral_numbers_written_as_floats_are_integers():
  from normstudy import cli
  assert cli._integral_override("--config.train.num_steps=1e3") == "--config.train.num_steps=1000"
  assert cli._integral_override("--config.train.num_steps=2000.0") == (
      "--config.train.num_steps=2000")
  for kept in ("--config.optimizer.learning_rate=1e-3", "--config.train.num_steps=2.5",
               "--config.label=1e3x", "--workdir=1e3"):
    assert cli._integral_override(kept) == kept


def test_an_unreadable_config_file_is_one_line_naming_it(tmp_path, monkeypatch):
  from normstudy import cli
  path = tmp_path / "locked.py"
  path.write_text("def get_config(variant=None):\n  return None\n")
  path.chmod(0)
  if os.access(path, os.R_OK):  # root reads it anyway: the kernel's refusal, injected
    real_open = open

    def refusing_open(file, *args, **kwargs):
      if os.fspath(file) == str(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
      return real_open(file, *args, **kwargs)
    monkeypatch.setattr("builtins.open", refusing_open)
  # Once worded "cannot write" (the environment's message for any EACCES).
  assert cli._missing_config_file(["main", f"--config={path}:v", "--workdir=w"]) == (
      f"config file '{path}' cannot be read: Permission denied (--config={path}:v)")


@pytest.mark.slow
def test_study_with_a_variant_is_one_line(tmp_path):
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.study", f"--config={SEED}", f"--workdir={workdir}",
                           check=False)
  _assert_one_line(result, "normstudy.study runs every variant of a config file; drop "
                   "':pre_norm_clip1'", workdir)


def _assert_one_line(result, message, workdir):
  assert result.returncode == 2
  errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert not workdir.exists()


@pytest.mark.slow
def test_workdir_holding_another_config_is_refused(tmp_path):
  workdir = tmp_path / "run"
  base = (f"--config={LM}", f"--workdir={workdir}", *runs.tiny_args(tmp_path / "tfds", 4, 2))
  runs.run_inline("normstudy.main", *base)
  before = _tree_listing(workdir)
  refused = runs.run_inline("normstudy.main", *base, "--config.model.d_ff=48",
                            "--config.optimizer.b1=0.8", check=False)
  assert refused.returncode == 2
  line = [l for l in refused.stderr.splitlines() if l.startswith("error:")][0]
  assert "model.d_ff: 32 -> 48" in line and "optimizer.b1: 0.9 -> 0.8" in line
  assert "--allow_config_change" in line
  assert _tree_listing(workdir) == before
  # Logging/checkpoint frequencies and num_steps may change; an explicit flag allows the rest.
  runs.run_inline("normstudy.main", *base, "--config.train.log_every=2",
                  "--config.train.num_steps=6")
  runs.run_inline("normstudy.main", *base, "--config.train.num_steps=8",
                  "--config.optimizer.b1=0.8", "--allow_config_change")
  assert runs.read_json(workdir / "config.json")["optimizer"]["b1"] == 0.8
  assert [r["step"] for r in runs.records(workdir)][-1] == 8


def test_resume_drops_records_after_the_checkpoint_and_a_torn_line(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  good = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}, {"step": 3, "loss": 1.4}]
  text = "".join(json.dumps(r) + "\n" for r in good) + '{"step": 4, "loss": 1.'
  (run / "metrics.jsonl").write_text(text)
  log = metrics_lib.MetricsLog(str(run), resume_step=2)
  log.close()
  assert [r["step"] for r in metrics_lib.read_records(str(run / "metrics.jsonl"))] == [1, 2]
  (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
  with pytest.raises(metrics_lib.DamagedRecords, match="metrics.jsonl:2"):
    list(metrics_lib.read_records(str(run / "metrics.jsonl")))


def test_config_differences_ignore_what_may_change():
  old = json.loads(config_lib.default_config().to_json_best_effort())
  new = json.loads(config_lib.default_config().to_json_best_effort())
  new["train"].update(num_steps=5000, log_every=7, checkpoint_every=11, telemetry_every=10)
  new["mesh"].update(data=2, fsdp=2, tensor=2)
  new["label"] = "renamed"
  assert per_run.config_differences(old, new) == []
  new["model"]["d_model"] = 64
  new["train"]["seed"] = 3
  assert per_run.config_differences(old, new) == ["model.d_model: 128 -> 64",
                                                 "train.seed: 0 -> 3"]
  # A run saved before train.eval_seed existed was evaluated on its own seed's masks (-1): it
  # continues as it was with -1, and the new default would change its eval set.
  older = json.loads(config_lib.default_config().to_json_best_effort())
  del older["train"]["eval_seed"]
  current = json.loads(config_lib.default_config().to_json_best_effort())
  assert per_run.config_differences(older, current) == ["train.eval_seed: '<absent>' -> 0"]
  current["train"]["eval_seed"] = -1
  assert per_run.config_differences(older, current) == []
  current["train"]["wandb_project"] = "p"  # tracking may start on a resume
  assert per_run.config_differences(older, current) == []


def test_a_directory_of_another_kind_is_refused():
  import tempfile
  for holds, kind in (("sweep.json", "run"), ("study.json", "run"), ("run.json", "sweep"),
                      ("metrics.jsonl", "study"), ("study.json", "sweep")):
    with tempfile.TemporaryDirectory() as path:
      open(os.path.join(path, holds), "w").close()
      with pytest.raises(errors.UserError) as e:
        rundir.check_kind(path, kind)
      found = {"sweep.json": "sweep", "study.json": "study"}.get(holds, "run")
      assert str(e.value).startswith(f"--workdir={path!r} holds a {found} ({holds}); a {kind} "
                                     "goes into a directory of its own")
      rundir.check_kind(path, found)  # its own kind continues
  with tempfile.TemporaryDirectory() as path:
    rundir.check_kind(path, "run")  # empty: any kind


@pytest.mark.slow
def test_a_run_into_a_sweep_and_a_sweep_into_a_run_are_one_line(tmp_path):
  sweep = tmp_path / "sweep"
  sweep.mkdir()
  (sweep / "sweep.json").write_text("{}")
  before = _tree_listing(sweep)
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={sweep}",
                           check=False)  # once trained into the sweep's root
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert f"error: --workdir='{sweep}' holds a sweep (sweep.json); a run goes into" in (
      result.stderr)
  assert _tree_listing(sweep) == before
  run = tmp_path / "run"
  run.mkdir()
  (run / "run.json").write_text("{}")
  result = runs.run_module("normstudy.sweep", f"--config={SEED}", f"--workdir={run}",
                           "--axis=train.seed=0,1", check=False)  # once trained around it
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert f"error: --workdir='{run}' holds a run (run.json); a sweep goes into" in result.stderr
  assert sorted(os.listdir(run)) == ["run.json"]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["main", "study", "sweep", "analyze"])
def test_help_lists_every_flag_the_command_takes(entry):
  import re
  source = open(os.path.join(runs.REPO, "normstudy", f"{entry}.py"), encoding="utf-8").read()
  expected = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
  if "define_workers_flag()" in source:
    expected.add("workers")  # defined in normstudy.cli, taken by this command
  result = runs.run_module(f"normstudy.{entry}", "--help")
  assert result.returncode == 0 and expected
  listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", result.stdout, re.M))
  assert expected <= listed, expected - listed


@pytest.mark.slow
def test_print_config_prints_the_resolved_config_and_writes_nothing(tmp_path):
  from configs import seed_figure
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                           "--config.train.num_steps=1e3", "--print_config")
  expected = seed_figure.get_config("pre_norm_clip1")
  expected.train.num_steps = 1000
  assert json.loads(result.stdout) == rundir.config_json(expected)
  assert not workdir.exists()


def test_a_run_starts_by_naming_what_differs_from_the_defaults():
  from normstudy import cli
  config = config_lib.default_config()
  config.optimizer.clip_norm = 10.0
  config.model.placement = "post_ln"
  lines = cli.config_changes(config)
  assert lines == ["config: 2 field(s) differ from the defaults (--print_config shows all):",
                   "  model.placement='post_ln'", "  optimizer.clip_norm=10.0"]


def test_a_grid_starts_by_naming_what_its_arms_change_from_the_defaults():
  from types import SimpleNamespace
  from normstudy import cli

  def run(arm, seed, **fields):
    config = config_lib.default_config()
    config.model.d_model, config.train.seed = 64, seed
    for dotted, value in fields.items():
      section, name = dotted.split("__")
      config[section][name] = value
    return SimpleNamespace(arm=arm, name=f"{arm}/{seed}", config=config)

  runs_ = [run("pre", 0), run("pre", 1), run("post", 0, model__placement="post_ln")]
  assert cli.grid_config_changes(runs_, {"train.seed"}) == [
      "config: 1 field(s) differ from the defaults in every arm (--print_config shows all):",
      "  model.d_model=64", "  arm post: model.placement='post_ln'"]


def test_a_config_file_that_exits_while_loaded_is_one_line(tmp_path):
  """Once exit 0, nothing trained and nothing said (issue 45)."""
  import runs
  path = tmp_path / "exits.py"
  path.write_text("import sys\nsys.exit(0)\n\ndef get_config(arg=None):\n  return None\n")
  for command in ("normstudy.main", "normstudy.sweep"):
    refused = runs.run_module(command, f"--config={path}", f"--workdir={tmp_path / 'w'}",
                              check=False)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"config file '{path}' exited (code 0) while it was loaded" in refused.stderr
    assert not (tmp_path / "w").exists()


def test_print_config_validates_as_a_run_would_and_is_in_the_help(tmp_path):
  """Once printed a config no run accepts, exit 0, and was in no --help (issue 45)."""
  import runs
  refused = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'w'}",
                            "--config.model.remat=foo", "--print_config", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
  assert "config.model.remat='foo' is not allowed; allowed: none, block, dots" in refused.stderr
  assert refused.stdout == "" and not (tmp_path / "w").exists()
  for command in ("normstudy.main", "normstudy.study", "normstudy.sweep"):
    assert "--[no]print_config" in runs.run_module(command, "--help").stdout


@pytest.mark.parametrize("flag, message", [
    ("--workers=2.5", "--workers=2.5 is not allowed; allowed: an integer"),  # once "invalid
    ("--probe_decades=x", "--probe_decades=x is not allowed; allowed: a number"),  # literal..."
])
def test_a_command_flag_of_the_wrong_type_is_one_plain_line(tmp_path, flag, message):
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.sweep", f"--config={SEED}", f"--workdir={workdir}", flag,
                           "--search=optimizer.learning_rate:0.1,1", check=False)
  _assert_one_line(result, message, workdir)


@pytest.mark.parametrize("source, message", [
    (None, "--config=FILE[:VARIANT] is required, e.g. --config=configs/seed_figure.py"),
    ("from normstudy.core.experiment import Experiment\n"
     "EXPERIMENT = Experiment(base=lambda: {'a': 1})\nget_config = EXPERIMENT.get_config\n",
     "returned a dict; it must return an ml_collections.ConfigDict"),
    ("import ml_collections\nfrom normstudy.core.experiment import Experiment\n"
     "EXPERIMENT = Experiment(base=lambda: ml_collections.ConfigDict({'a': 1}))\n"
     "get_config = EXPERIMENT.get_config\n",
     "returned a config without the section(s) model, loss, optimizer, data, mesh, train"),
])
def test_a_missing_config_or_one_that_is_not_a_config_is_one_line(tmp_path, source, message):
  """Once "get_config() of '' returned None", an AttributeError traceback or "error: 'train'"
  (issue 45)."""
  workdir = tmp_path / "never"
  args = []
  if source is not None:
    (tmp_path / "c.py").write_text(source)
    args = [f"--config={tmp_path / 'c.py'}"]
  for command in ("normstudy.main",) + (("normstudy.sweep",) if source else ()):
    extra = ("--axis=train.seed=0",) if command == "normstudy.sweep" else ()
    result = runs.run_module(command, *args, f"--workdir={workdir}", *extra, check=False)
    _assert_one_line(result, message, workdir)


@pytest.mark.slow
def test_optimizer_side_techniques_resume_bit_exactly_in_float16(tmp_path):
  """Skip-step (its rings in the optimizer state), update clipping, QK-clip (a post-step
  transform) and Adam-atan2, all on in one float16 run with dynamic loss scaling: 20 steps, then
  continued to 40 from the checkpoint, records the same 40 steps as one uninterrupted run, bit
  for bit, and each technique acted on both sides of the resume (issue 43)."""
  techniques = ("--config.optimizer.name=adam_atan2", "--config.optimizer.update_clip=0.5",
                "--config.optimizer.skip_spikes=0.5", "--config.optimizer.skip_spikes_window=19",
                "--config.model.qk_clip=0.5", "--config.model.dtype=float16",
                "--config.optimizer.schedule=constant", "--config.optimizer.learning_rate=0.01",
                "--config.train.log_every=1")

  def run(workdir, steps):
    runs.run_inline("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                    *_args(tmp_path, num_steps=steps, every=10, extra=techniques))

  run(tmp_path / "whole", 40)
  run(tmp_path / "resumed", 20)
  run(tmp_path / "resumed", 40)
  whole = runs.trajectory(tmp_path / "whole")
  assert [r["step"] for r in whole] == list(range(1, 41))
  assert runs.trajectory(tmp_path / "resumed") == whole
  for half in (whole[:20], whole[20:]):
    assert sum(r["qk_clipped_heads"] for r in half) > 0
    assert sum(r["loss_scale"] != 1 for r in half) == len(half)  # float16's scaler on
  skips = [r["spike_skips"] for r in whole]
  assert skips[19] < skips[-1]  # skip-step judged after the resume too
  # The analysis reports how many updates skip-step withheld (spike_handling.csv compares it).
  runs.run_inline("normstudy.analyze", f"--workdir={tmp_path / 'whole'}")
  summary = pd.read_csv(tmp_path / "whole" / "summary.csv")
  assert summary.spike_skips.tolist() == [skips[-1]]


@pytest.mark.parametrize("source, variant, message", [
    # Issue 78, item 4: once "Error whilst parsing config file:" and nothing after.
    ("from configs import seed_figure\nfrom normstudy.core.experiment import Experiment\n"
     "EXPERIMENT = Experiment(base=seed_figure.base_config,\n"
     "                        arms={'x': ('x', {'model.no_such': 1})})\n"
     "get_config = EXPERIMENT.get_config\n",
     ":x", "unknown config field 'model.no_such' (--config="),
    # Issue 78, item 1: once accepted, then a 63-line ValueError from inside the model 26 s later.
    ("from configs import seed_figure\n\ndef get_config(v='pre_norm_clip1'):\n"
     "  c = seed_figure.get_config(v)\n  c.model.no_such_knob = 7\n  return c\n",
     "", "config.model.no_such_knob=7 is not a config field (its config file sets it)"),
    # Issue 78, item 6: once "... of original type <class 'str'> and cannot be casted to type
    # <class 'int'>", no file named.
    ("from configs import seed_figure\n\ndef get_config(v='pre_norm_clip1'):\n"
     "  c = seed_figure.get_config(v)\n  c.train.num_steps = '3'\n  return c\n",
     "", "num_steps='3' is not allowed; allowed: an integer (a str was given, --config="),
    # Issue 78, item 9: once "error: \"'train'\"".
    ("from configs import seed_figure\n\ndef get_config(v='pre_norm_clip1'):\n"
     "  c = seed_figure.get_config(v)\n  del c['train']\n  return c\n",
     "", "returned a config without the section(s) train"),
    # Issue 78, item 8: once "get_config() takes 0 positional arguments but 1 was given".
    ("from configs import seed_figure\n\ndef get_config():\n  return seed_figure.get_config()\n",
     ":x", "takes no variant; drop ':x' from --config="),
])
def test_a_config_file_mistake_is_one_line_with_its_reason(tmp_path, source, variant, message):
  workdir = tmp_path / "never"
  (tmp_path / "c.py").write_text(source)
  result = runs.run_module("normstudy.main", f"--config={tmp_path / 'c.py'}{variant}",
                           f"--workdir={workdir}", check=False)
  _assert_one_line(result, message, workdir)


@pytest.mark.parametrize("args,message", [
    # Issue 78, item 13: a line break in a label or a workdir's name was taken as it was.
    (("--config.label=a\nb",), "config.label='a\\nb' holds a line break; allowed: one line"),
    (("--workdir=/tmp/a\nb",), "--workdir='/tmp/a\\nb' holds a line break; allowed: a path on "
                               "one line"),
])
def test_a_line_break_in_a_label_or_a_workdir_is_one_line(tmp_path, args, message):
  workdir = tmp_path / "never"
  args = args if any(a.startswith("--workdir") for a in args) else (*args, f"--workdir={workdir}")
  result = runs.run_module("normstudy.main", f"--config={SEED}", *args, check=False)
  _assert_one_line(result, message, workdir)


# Issue 78's "20 new bad inputs of your own": those of them that were not one line with exit 2
# before this commit (each listed, with what it printed and prints, in the closing note).
_SYNTAX = "def get_config(:\n"
_INDENT = "def get_config():\n\treturn 1\n  x = 2\n"
_NONE = "def get_config():\n  return None\n"


@pytest.mark.parametrize("command,args,env,source,message", [
    ("normstudy.main", ("--workdir=gs://b1/x",), {"STORAGE_EMULATOR_HOST":
                                                  "http://127.0.0.1:notaport"}, None,
     "STORAGE_EMULATOR_HOST='http://127.0.0.1:notaport' is not allowed; allowed: HOST:PORT or "
     "http://HOST:PORT (a local storage server)"),  # a ValueError traceback
    ("normstudy.main", ("--workdir=",), {}, None,
     "--workdir='' names no directory; allowed: a new or empty directory, one normstudy "
     "wrote, or gs://BUCKET/PATH"),  # "cannot be created: No such file or directory"
    ("normstudy.main", ("--workdir={tmp}/a\tb",), {}, None,
     "--workdir='{tmp}/a\\tb' holds a control character; allowed: a path of printable "
     "characters"),  # a directory with a tab in its name
    ("normstudy.study", ("--seeds=",), {}, None,
     "--seeds= names no seed; allowed: distinct integers >= 0, e.g. --seeds=0,1,2 (leave the "
     "flag out for the file's own seeds)"),  # trained the whole study at the files' seeds
    ("normstudy.main", ("--config.label=a\tb",), {}, None,
     "config.label='a\\tb' holds a control character; allowed: one line of printable "
     "characters"),  # a legend entry with a tab in it
    ("normstudy.main", (), {}, _SYNTAX,
     "config file '{path}' is not valid Python: invalid syntax (line 1) (--config={path})"),
    ("normstudy.main", (), {}, _INDENT,
     "config file '{path}' is not valid Python: unindent does not match any outer indentation "
     "level (line 3) (--config={path})"),  # both: "invalid syntax (x.py, line 1)", no path
    ("normstudy.main", (), {}, _NONE,
     "get_config() of '{path}' returned None (--config={path}); it must return an "
     "ml_collections.ConfigDict"),  # after two lines of absl's and ml_collections' warnings
    ("normstudy.main", ("--config.train.wandb_project=team/project",), {}, None,
     "config.train.wandb_project='team/project' is not allowed; allowed: \"\" (off) or a W&B "
     "project name of at most 128 characters, without / \\ # ? % :"),  # trained, kept offline
    ("normstudy.main", ("--config.train.seed=99999999999999999999",), {}, None,
     "config.train.seed=99999999999999999999 is not allowed; allowed: an integer in [0, 2^31) "
     "(a run counts in 32-bit integers)"),  # "in [0, 2^31), below 2^31"
])
def test_new_bad_inputs_at_the_seams_touched_are_one_line(tmp_path, command, args, env, source,
                                                          message):
  workdir = tmp_path / "never"
  config = SEED if command == "normstudy.main" else "configs/seed_figure.py"
  if source is not None:
    config = tmp_path / "bad_config.py"
    config.write_text(source)
    message = message.format(path=config)
  args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
  message = message.replace("{tmp}", str(tmp_path))
  args = args if any(a.startswith("--workdir") for a in args) else (*args, f"--workdir={workdir}")
  result = runs.run_module(command, f"--config={config}", *args, check=False,
                           env=dict(os.environ, **env) if env else None)
  _assert_one_line(result, message, workdir)
  assert sorted(os.listdir(tmp_path)) == (["bad_config.py"] if source is not None else [])


def test_a_smoothing_outside_its_range_is_one_line_naming_what_is_allowed():
  """Once "--smoothing=1.5 is outside [0, 1)": no "allowed", no meaning."""
  result = runs.run_module("normstudy.analyze", "--workdir=docs/seed_figure_text",
                           "--smoothing=1.5", check=False)
  assert result.returncode == 2 and result.stderr.strip().splitlines() == [
      "error: --smoothing=1.5 is not allowed; allowed: a number in [0, 1) (the EMA's weight of "
      "the past; 0: no smoothing)"], result.stderr


@pytest.mark.slow
def test_a_workdir_under_tilde_is_the_home_directory(tmp_path):
  """Issue 78, item 12: `--workdir=~/wd` once made a directory literally named `~` in the
  working directory; `~` is the home directory, as in a shell."""
  home = tmp_path / "home"
  home.mkdir()
  result = runs.run_module("normstudy.main", f"--config={SEED}", "--workdir=~/wd",
                           *runs.tiny_args(tmp_path / "tfds", num_steps=2, every=2),
                           env=dict(os.environ, HOME=str(home)))
  assert (home / "wd" / "run.json").is_file(), result.stderr[-2000:]
  assert not os.path.exists(os.path.join(runs.REPO, "~"))


@pytest.mark.parametrize("command", ["normstudy.main", "normstudy.study", "normstudy.sweep"])
def test_ctrl_c_while_a_config_loads_is_one_line_and_exit_130(tmp_path, command):
  """Issue 78, item 3: Ctrl-C once printed a KeyboardInterrupt traceback (main, rc 130) or an
  "Exception ignored" traceback and the config anyway (study, rc 0). Sent while the config file
  loads (its get_config waits), each command stops with one line and 130, writing nothing."""
  started = tmp_path / "started"
  config = tmp_path / "slow.py"
  config.write_text("import pathlib, time\nfrom configs import seed_figure\n"
                    "EXPERIMENT = seed_figure.EXPERIMENT\n\n"
                    "def get_config(variant='pre_norm_clip1'):\n"
                    f"  pathlib.Path({str(started)!r}).touch()\n  time.sleep(60)\n"
                    "  return seed_figure.get_config(variant)\n")
  workdir = tmp_path / "never"
  process = runs.start_module(command, f"--config={config}", f"--workdir={workdir}",
                              "--print_config")
  deadline = time.monotonic() + runs.bound(120)
  while not started.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
  process.send_signal(signal.SIGINT)
  out, err = process.communicate(timeout=runs.bound(120))
  assert process.returncode == 130, err[-2000:]
  assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted")
  assert not out and not workdir.exists()


@pytest.mark.parametrize("command", ["normstudy.main", "normstudy.sweep"])
def test_ctrl_c_while_the_command_imports_its_libraries_is_one_line_and_exit_130(tmp_path,
                                                                                command):
  """Issue 78, item 3, its last part: Ctrl-C in the first second, while `python -m
  normstudy.<command>` imports jax, flax and the rest, printed Python's KeyboardInterrupt
  traceback. A real `python -X importtime -m` (no fork server: its imports are done already);
  the signal is sent as soon as the command's module begins importing its first library (absl:
  the package's own import does nothing, normstudy.cli comes first), while it still imports
  the rest."""
  import subprocess
  process = subprocess.Popen(
      [*runs.WITH_CTRL_C, "-X", "importtime", "-m", command, "--config=configs/seed_figure.py",
       f"--workdir={tmp_path / 'never'}"], cwd=runs.REPO, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  seen, package = [], False
  for line in process.stderr:
    seen.append(line)
    if "| normstudy" in line:
      package = True  # the package (and nothing else) has imported
    if package and "absl" in line.split("|")[-1]:  # the command's libraries are importing
      process.send_signal(signal.SIGINT)
      break
  out, err = process.communicate(timeout=runs.bound(120))
  said = [l for l in err.splitlines() if not l.startswith("import time:")]
  assert any(l.rstrip().endswith("| normstudy") for l in seen) and "absl" in seen[-1]
  assert process.returncode == 130, err[-3000:]
  assert said == ["interrupted (Ctrl-C): stopped; a run continues from its last checkpoint "
                  "with the same command"], said[-20:]
  assert not out and not (tmp_path / "never").exists()


@pytest.mark.parametrize("command,extra", [("normstudy.main", ()),
                                           ("normstudy.sweep", ("--axis=train.seed=0",))])
def test_a_directory_normstudy_did_not_write_is_not_trained_into(tmp_path, command, extra):
  """Issue 78, item 11: --workdir=. from the repository's root, or a folder of notes, was
  trained into. A non-empty directory without normstudy's files is one line, left as it was."""
  workdir = tmp_path / "notes"
  (workdir / "photos").mkdir(parents=True)
  (workdir / "my_notes.txt").write_text("mine\n")
  before = _tree_listing(workdir)
  result = runs.run_module(command, f"--config={SEED}", f"--workdir={workdir}", *extra,
                           check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={str(workdir)!r} holds files normstudy did not write (my_notes.txt, "
      f"photos); a {'run' if command == 'normstudy.main' else 'sweep'} goes into a new or "
      "empty directory, or one normstudy wrote: choose another --workdir")
  assert _tree_listing(workdir) == before


@pytest.mark.slow
def test_checkpoint_every_minus_one_keeps_no_state_and_the_run_still_finishes(tmp_path):
  """train.checkpoint_every=-1 (a lease's sweep whose states nobody reads, benchmarks/
  lease.py ladder): no checkpoint at any step, not even the last, the records whole; -2 is refused
  naming what is allowed."""
  workdir = tmp_path / "run"
  runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                  *_args(tmp_path, num_steps=12, every=4),
                  "--config.train.checkpoint_every=-1")
  assert rundir.checkpointed_steps(str(workdir / schema.CHECKPOINTS)) == []
  assert rundir.RunDir(str(workdir)).status() == schema.FINISHED
  steps = [r["step"] for r in metrics_lib.read_records(str(workdir / schema.METRICS))
           if "loss" in r]
  assert steps == list(range(1, 13))
  config = config_lib.default_config()
  config.train.checkpoint_every = -2
  with pytest.raises(errors.ConfigError, match=r"config.train.checkpoint_every=-2 is not allowed; "
                     r"allowed: -1 \(never\), 0 \(only at the end\) or an integer >= 1"):
    validation.validate(config)


@pytest.mark.slow
def test_damaged_records_through_main_and_analyze_are_one_line_never_a_traceback(tmp_path):
  """Issue 88, items 1, 2 and 15: run.json holding null or [1], config.json holding [] (once
  reported as "no config.json"), a metrics line whose step is the string "60": `main` (the same
  command again) and `analyze` as subprocesses print one line naming the file, or, for a
  damaged metrics line, skip it with a warning; never a traceback."""
  import shutil
  workdir = tmp_path / "run"
  args = (f"--config={SEED}", f"--workdir={workdir}", *_args(tmp_path, num_steps=6, every=3))
  runs.run_module("normstudy.main", *args)
  clean = tmp_path / "clean"
  shutil.copytree(workdir, clean)
  cases = [(schema.RUN, "null", "holds null where a JSON object is expected"),
           (schema.RUN, "[1]", "holds [1] where a JSON object is expected"),
           (schema.CONFIG, "[]", f"{schema.CONFIG} is damaged: it holds [] where a JSON object")]
  for name, text, message in cases:
    shutil.rmtree(workdir)
    shutil.copytree(clean, workdir)
    (workdir / name).write_text(text)
    for module, argv in (("normstudy.main", args), ("normstudy.analyze", (f"--workdir={workdir}",))):
      result = runs.run_module(module, *argv, check=False)
      assert result.returncode == 2, (name, text, module, result.stderr[-1500:])
      assert "Traceback" not in result.stderr, (name, module, result.stderr[-1500:])
      errors_ = [l for l in result.stderr.splitlines() if l.startswith("error:")]
      assert len(errors_) == 1 and message in errors_[0], (name, module, errors_)
      assert str(workdir / name) in errors_[0]
  # A record whose step is a string: a damaged line, skipped with a warning naming it.
  shutil.rmtree(workdir)
  shutil.copytree(clean, workdir)
  lines = (workdir / schema.METRICS).read_text().splitlines()
  record = json.loads(lines[1])
  record["step"] = str(record["step"])
  lines[1] = json.dumps(record)
  (workdir / schema.METRICS).write_text("\n".join(lines) + "\n")
  analysed = runs.run_module("normstudy.analyze", f"--workdir={workdir}", check=False)
  assert analysed.returncode == 0 and "Traceback" not in analysed.stderr, analysed.stderr[-1500:]
  assert "skipping a damaged line" in analysed.stderr
  again = runs.run_module("normstudy.main", *args, check=False)
  assert "Traceback" not in again.stderr, again.stderr[-1500:]
  assert again.returncode == 0, again.stderr[-1500:]


def test_the_stop_signal_handler_only_sets_a_flag():
  """Issue 88, item 6: Ctrl-C while a progress line was being written printed ~100 lines of
  "--- Logging error ---" (the handler logged a line itself and re-entered the write it had
  interrupted). The handler now only records the signal; the loop says what it does."""
  from absl import logging as absl_logging
  from normstudy.engine import train
  seen = []

  class Catch(absl_logging.logging.Handler):
    def emit(self, record):
      seen.append(record.getMessage())

  catcher = Catch()
  absl_logging.get_absl_logger().addHandler(catcher)
  try:
    with train.stop_signals() as received:
      os.kill(os.getpid(), signal.SIGTERM)
      deadline = time.monotonic() + 5
      while received["signal"] is None and time.monotonic() < deadline:
        time.sleep(0.01)
  finally:
    absl_logging.get_absl_logger().removeHandler(catcher)
  assert received["signal"] == "SIGTERM"
  assert seen == []  # nothing written from inside the handler


@pytest.mark.slow
def test_rerunning_a_finished_run_says_so_and_trains_nothing(tmp_path):
  """Issue 88, item 18: the same command again over a finished run printed "steps 61..60" as if
  it trained; it says the run had finished, trains nothing and leaves the records as they were."""
  workdir = tmp_path / "run"
  args = (f"--config={SEED}", f"--workdir={workdir}", *_args(tmp_path, num_steps=6, every=3))
  runs.run_module("normstudy.main", *args)
  before = (workdir / schema.METRICS).read_bytes()
  again = runs.run_module("normstudy.main", *args)
  assert "finished at step 6 already: nothing to train" in again.stderr
  assert "steps 7..6" not in again.stderr and "training 1 run(s)" not in again.stderr
  assert again.stdout.strip().splitlines()[-1].startswith("finished: step 6, loss ")
  assert (workdir / schema.METRICS).read_bytes() == before


def test_a_config_field_given_twice_is_said_and_the_last_wins(tmp_path):
  """Issue 88, item 14: `--config.a.b=1 ... --config.a.b=2` took the last without a word (a
  script that appends overrides relies on last-wins, so it is a warning line, not a refusal)."""
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'x'}",
                           "--config.optimizer.learning_rate=0.1",
                           "--config.optimizer.learning_rate=0.2", "--print_config")
  assert ("warning: --config.optimizer.learning_rate is given twice ('0.1', then '0.2'): the "
          "last wins") in result.stderr.splitlines()
  assert json.loads(result.stdout[result.stdout.index("{"):])["optimizer"]["learning_rate"] == 0.2
  assert not (tmp_path / "x").exists()


def test_more_workers_than_cores_is_said(tmp_path, capsys):
  """Issue 88, item 12: --workers=64 on 2 cores was taken without a word (capped at one worker a
  core by normstudy.experiments.workers.count)."""
  from normstudy import cli
  cores = len(os.sched_getaffinity(0))
  cli.check_workers(cores)
  assert capsys.readouterr().err == ""
  cli.check_workers(cores + 62)
  assert capsys.readouterr().err == (
      f"warning: --workers={cores + 62} is more than this machine's {cores} cores: at most "
      f"{cores} workers train, one per core\n")
  with pytest.raises(errors.UserError, match=r"--workers=-1 is not allowed"):
    cli.check_workers(-1)


def test_an_accelerator_jax_cannot_reach_is_one_line(tmp_path):
  """Issue 88, item 4: JAX_PLATFORMS=gpu on a machine without a GPU was jax's 37-line traceback
  naming 'rocm'; it is one line saying what to do, and nothing is written."""
  env = dict(os.environ, JAX_PLATFORMS="gpu")
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'x'}",
                           check=False, env=env)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1500:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith("error: Unable to initialize backend ")
  assert line.endswith("JAX_PLATFORMS='gpu' asks for an accelerator this machine's jax cannot "
                       "reach: unset it (jax chooses what there is), or install the "
                       "accelerator's jax (pip install -e '.[gpu]' for CUDA)")
  assert not (tmp_path / "x").exists()


def test_a_wandb_mode_wandb_does_not_know_is_one_line(tmp_path):
  """Issue 88, item 10: WANDB_MODE=garbage turned W&B off without a word."""
  env = dict(os.environ, WANDB_MODE="garbage")
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'x'}",
                           "--config.train.wandb_project=p", check=False, env=env)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1500:]
  assert result.stderr.strip().splitlines()[-1] == (
      "error: WANDB_MODE='garbage' is not allowed; allowed: online, offline, disabled, shared, "
      "dryrun, run (or unset: online with an API key, else offline)")
  assert not (tmp_path / "x").exists()


def test_a_label_too_long_for_a_legend_is_one_line(tmp_path):
  """Issue 88, item 13: a 5,000-character label's legend covered the curves."""
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'x'}",
                           "--config.label=" + "x" * 5000, check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "error: config.label is 5000 characters long ('" + "x" * 40 + "'...); allowed: at most "
      "200 (a legend entry)")
  assert not (tmp_path / "x").exists()


def test_ctrl_c_after_the_work_is_done_is_ignored(tmp_path):
  """Issue 88, item 7: Ctrl-C after `main --print_config` had printed (the interpreter tearing
  down) printed "Exception ignored in _xla_gc_callback ... KeyboardInterrupt" and exited 0. Once
  a command's work is done, SIGINT is ignored until the process ends: a command (run in its own
  interpreter) records the handler while it works and at exit."""
  import subprocess
  script = tmp_path / "command.py"
  script.write_text(
      "import atexit, signal, sys\n"
      "from normstudy import cli\n"
      "seen = []\n"
      "atexit.register(lambda: print(seen, signal.getsignal(signal.SIGINT) is signal.SIG_IGN))\n"
      "cli.run(lambda argv: seen.append(signal.getsignal(signal.SIGINT) is "
      "signal.default_int_handler), lambda: None)\n")
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=runs.bound(60), cwd=runs.REPO)
  assert result.returncode == 0, result.stderr[-1500:]
  assert result.stdout.strip() == "[True] True"  # Ctrl-C stops the work; once done, ignored


@pytest.mark.slow
def test_a_file_size_limit_is_a_full_disk_in_one_line(tmp_path):
  """Issue 88, item 5: under `ulimit -f 20` a run printed 477 lines with 11 tracebacks (Errno 27
  File too large, from orbax's threads and from writing the libraries' log) and once left
  run.json saying "finished" with no checkpoint saved. It is one line now, run.json does not say
  finished, and the same command without the limit trains the run to its end."""
  import resource

  def limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, 20 * 1024))

  workdir = tmp_path / "run"
  args = (f"--config={SEED}", f"--workdir={workdir}", *_args(tmp_path, num_steps=12, every=4))
  # The dataset made first, without the limit: the limit is to hit the run's own files.
  runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'warm'}",
                  *_args(tmp_path, num_steps=1, every=1))
  result = runs.run_module("normstudy.main", *args, check=False, preexec_fn=limit)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors_ = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert len(errors_) == 1 and errors_[0].startswith("error: disk full"), errors_
  assert rundir.RunDir(str(workdir)).status() != schema.FINISHED
  assert (workdir / schema.METRICS).exists()  # it trained until its first checkpoint failed
  runs.run_module("normstudy.main", *args)
  assert rundir.RunDir(str(workdir)).status() == schema.FINISHED


@pytest.mark.slow
def test_starting_over_without_a_checkpoint_says_so_and_keeps_the_old_records(tmp_path):
  """Issue 88, item 9: with its checkpoints deleted, the same command retrained from step 1 and
  overwrote the recorded steps without a word. It says how many records it sets aside and
  where, keeps them byte for byte, and the new run retraces the old trajectory (same config,
  same seed)."""
  workdir = tmp_path / "run"
  args = (f"--config={SEED}", f"--workdir={workdir}", *_args(tmp_path, num_steps=6, every=3))
  runs.run_module("normstudy.main", *args)
  before = (workdir / schema.METRICS).read_bytes()
  old = [r for r in metrics_lib.read_records(str(workdir / schema.METRICS))]
  shutil.rmtree(workdir / schema.CHECKPOINTS)
  again = runs.run_module("normstudy.main", *args)
  line = (f"holds {len(old)} records (steps 1-6) but {workdir / schema.CHECKPOINTS} has no "
          f"checkpoint to continue them from; starting over from step 1, the old records moved "
          f"to {schema.METRICS_BEFORE_RESTART}")
  assert any(line in text for text in again.stderr.splitlines()), again.stderr[-3000:]
  assert (workdir / schema.METRICS_BEFORE_RESTART).read_bytes() == before
  new = list(metrics_lib.read_records(str(workdir / schema.METRICS)))
  assert [(r["step"], r.get("loss")) for r in new] == [(r["step"], r.get("loss")) for r in old]


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_starts_over_saying_so_and_keeps_the_records(
    tmp_path):
  """Issue 88, item 9, its second half: kill -9 before the first checkpoint was complete, then
  the same command: it started over without saying that it discarded the recorded steps. It
  says so, keeps them aside byte for byte as they were when killed, and the run it trains is the
  uninterrupted one (the same config and seed)."""
  args = (f"--config={SEED}", *_args(tmp_path, num_steps=40, every=40))
  reference = tmp_path / "reference"
  runs.run_module("normstudy.main", f"--workdir={reference}", *args)
  killed = tmp_path / "killed"
  proc = runs.start_module("normstudy.main", f"--workdir={killed}", *args)
  assert runs.wait_for_records(proc, killed, 5)  # the first checkpoint comes at step 40
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=runs.bound(120))
  assert rundir.checkpointed_steps(str(killed / schema.CHECKPOINTS)) == []
  before = (killed / schema.METRICS).read_bytes()
  recorded = list(metrics_lib.read_records(str(killed / schema.METRICS)))
  again = runs.run_module("normstudy.main", f"--workdir={killed}", *args)
  assert (f"holds {len(recorded)} records (steps {recorded[0]['step']}-{recorded[-1]['step']}) "
          f"but {killed / schema.CHECKPOINTS} has no checkpoint") in again.stderr
  assert (killed / schema.METRICS_BEFORE_RESTART).read_bytes() == before
  assert runs.trajectory(killed) == runs.trajectory(reference)


def test_a_command_run_in_the_test_process_leaves_its_signal_handlers_as_they_were(tmp_path):
  """A command ignores Ctrl-C once its work is done; run inside a test process (runs.run_inline)
  it left SIGINT ignored there, and every process a later test started inherited SIG_IGN: a
  Ctrl-C test's command then trained on (order-dependent under pytest-xdist)."""
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  runs.run_inline("normstudy.main", f"--config={SEED}", f"--workdir={tmp_path / 'x'}",
                  "--print_config")
  assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before


def test_a_second_start_over_keeps_the_records_of_the_first(tmp_path):
  """Records set aside on starting over are added to metrics.before_restart.jsonl, not written
  over it: two restarts in a row keep both sets, in order."""
  first, second = '{"step": 1, "loss": 5.0}\n', '{"step": 1, "loss": 4.0}\n'
  (tmp_path / schema.METRICS).write_text(first)
  metrics_lib.MetricsLog(str(tmp_path), None).close()
  (tmp_path / schema.METRICS).write_text(second)
  metrics_lib.MetricsLog(str(tmp_path), None).close()
  assert (tmp_path / schema.METRICS_BEFORE_RESTART).read_text() == first + second
  assert (tmp_path / schema.METRICS).read_text() == ""

"""The Weights & Biases writer in wandb's offline mode: the runs' files read back with a reader
written here from the format (LevelDB's log of protobuf records), never the network."""

import glob
import os
import re
import signal
import struct

import pytest

import runs

SEED = "configs/seed_figure.py:pre_norm_clip1"
BLOCK = 32768  # LevelDB log blocks; a .wandb file is ":W&B" + 3 bytes, then the log


def wandb_history(run_dir):
  """{step: {key: value}} of every .wandb file under `run_dir`/wandb (oldest first), with the
  id of the wandb run each belongs to."""
  from wandb.proto import wandb_internal_pb2 as pb
  history, ids = {}, set()
  for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "*.wandb"))):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending, chunks = 7, b"", []
    while pos + 7 <= len(data):
      left = BLOCK - pos % BLOCK
      if left < 7:
        pos += left
        continue
      _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
      if kind == 0 and length == 0:  # the block's zero padding
        pos += left
        continue
      chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
      if kind == 1:
        chunks.append(chunk)
      elif kind in (2, 3):
        pending += chunk
      elif kind == 4:
        chunks.append(pending + chunk)
        pending = b""
    for raw in chunks:
      record = pb.Record()
      record.ParseFromString(raw)
      kind = record.WhichOneof("record_type")
      if kind == "run":
        ids.add(record.run.run_id)
      elif kind == "history":
        items = {item.key or "/".join(item.nested_key): item.value_json
                 for item in record.history.item}
        history.setdefault(int(items["_step"]), {}).update(
            {k: float(v) for k, v in items.items() if not k.startswith("_")})
  return history, ids


@pytest.mark.slow
def test_a_run_sends_its_records_to_wandb_offline_and_a_resume_continues_the_same_run(tmp_path):
  pytest.importorskip("wandb")
  env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
  workdir = tmp_path / "run"
  args = (f"--config={SEED}", f"--workdir={workdir}", "--config.train.wandb_project=normstudy",
          *runs.tiny_args(tmp_path / "tfds", num_steps=400, every=100))
  proc = runs.start_module("normstudy.main", *args, env=env)
  assert runs.wait_for_records(proc, workdir, 150)
  proc.send_signal(signal.SIGTERM)  # preempted: checkpoint, then stop
  proc.communicate(timeout=runs.bound(120))
  runs.run_module("normstudy.main", *args, env=env)
  records = runs.records(workdir)
  history, ids = wandb_history(workdir)
  run_id = runs.read_json(workdir / "run.json")["wandb_run_id"]
  assert ids == {run_id}  # one wandb run, continued by the resume
  assert sorted(history) == [r["step"] for r in records]
  for record in records:  # the same keys and values as metrics.jsonl
    sent = history[record["step"]]
    for key, value in record.items():
      if key != "step" and isinstance(value, (int, float)):
        assert sent[key] == pytest.approx(float(value), nan_ok=True), (record["step"], key)


def test_wandb_project_without_wandb_installed_is_refused(monkeypatch):
  import importlib.util
  from normstudy import errors
  from normstudy.core import config as config_lib
  from normstudy.experiments import preflight
  config = config_lib.default_config()
  config.train.wandb_project = "p"
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(errors.UserError, match=r"^config.train.wandb_project='p' needs wandb, "
                     r"which is not installed: pip install -e '.\[wandb\]'$"):
    preflight.check_tracking(config)
  config.train.wandb_project = ""
  preflight.check_tracking(config)  # off: nothing asked


def test_a_wandb_that_fails_on_import_is_refused_in_one_line(tmp_path):
  """Once: trained, exit 0, nothing sent and nothing said (issue 45)."""
  broken = tmp_path / "site" / "wandb"
  broken.mkdir(parents=True)
  (broken / "__init__.py").write_text("raise ImportError('libfoo.so: cannot open')\n")
  env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}:{os.environ.get('PYTHONPATH', '')}")
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                           "--config.train.wandb_project=p",
                           *runs.tiny_args(tmp_path / "tfds", num_steps=2, every=2), env=env,
                           check=False)
  assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
  assert ("config.train.wandb_project='p': wandb is installed but its import fails "
          "(ImportError: libfoo.so: cannot open)") in result.stderr
  assert not workdir.exists()


def test_the_wandb_mode_without_a_key_is_offline_and_says_so(tmp_path, monkeypatch):
  from normstudy.engine import writers
  monkeypatch.delenv("WANDB_MODE", raising=False)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
  monkeypatch.delenv("NETRC", raising=False)
  assert writers.wandb_mode() == "offline"
  (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
  os.chmod(tmp_path / ".netrc", 0o600)
  assert writers.wandb_mode() == "online"  # what `wandb login` writes
  monkeypatch.setenv("WANDB_MODE", "disabled")
  assert writers.wandb_mode() == "disabled"


@pytest.mark.slow
def test_a_run_without_a_wandb_key_keeps_its_records_offline_with_one_warning(tmp_path):
  pytest.importorskip("wandb")
  env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
  env.update(HOME=str(tmp_path / "home"), WANDB_SILENT="true")
  workdir = tmp_path / "run"
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                           "--config.train.wandb_project=normstudy",
                           *runs.tiny_args(tmp_path / "tfds", num_steps=4, every=2), env=env)
  assert "wandb: no API key (WANDB_API_KEY or `wandb login`): records kept offline in" in (
      result.stderr)
  history, _ = wandb_history(workdir)
  assert sorted(history) == [r["step"] for r in runs.records(workdir)]


@pytest.mark.slow
def test_wandbs_own_lines_go_to_the_log_file_and_normstudys_one_line_stays(tmp_path):
  """Issue 78, item 17: without an API key wandb printed some 30 lines of its own (its version,
  where the run is kept, the run's summary, how to sync it) on the terminal. They are in the
  run's normstudy.log; the terminal keeps normstudy's one line about the offline mode."""
  pytest.importorskip("wandb")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("WANDB_")}  # no mode, no key, not silent: as a new user runs it
  env["HOME"] = str(tmp_path / "home")  # no ~/.netrc: no key
  workdir = tmp_path / "run"
  result = runs.run_module("normstudy.main", f"--config={SEED}", f"--workdir={workdir}",
                           "--config.train.wandb_project=normstudy",
                           *runs.tiny_args(tmp_path / "tfds", num_steps=4, every=2), env=env)
  said = [line for line in (result.stdout + result.stderr).splitlines()
          if re.search(r"(^|\] )wandb: ", line)]
  assert len(said) == 1 and "wandb: no API key (WANDB_API_KEY or `wandb login`)" in said[0], said
  log = (workdir / "normstudy.log").read_text()
  assert "Tracking run with wandb version" in log and "wandb sync" in log
  assert glob.glob(str(workdir / "wandb" / "offline-run-*"))  # the records were kept

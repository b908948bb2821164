"""What a run writes, read back: directories an older normstudy wrote load and analyse to the
same tables today.

tests/fixtures/runs_12de52b/ holds a study, a learning-rate sweep, a search, a sweep of seeds,
a sweep of depths and a single run, trained and analysed by normstudy at commit 12de52b
(tests/fixtures/make_runs_12de52b.sh says how), without checkpoints and figures. Their tables
were 12de52b's until the failure rule changed what they say (normstudy.records.outcomes:
recoveries, persistence); since then tests/fixtures/reanalyse.py writes them, and a change to
what the analysis writes shows here.
"""

import json
import os
import re
import shutil

import pytest

import runs

from normstudy import analysis
from normstudy.records import rundir
from normstudy.records import schema

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runs_12de52b")
EXPERIMENTS = ("study", "sweep", "search", "speed", "depth", "run")


def _outputs(directory):
  """{relative path: bytes} of the tables and observations an analysis wrote below `directory`."""
  found = {}
  for root, _, files in os.walk(directory):
    for name in files:
      if name.endswith(".csv") or name == "observations.md":
        path = os.path.join(root, name)
        with open(path, "rb") as f:
          found[os.path.relpath(path, directory)] = f.read()
  return found


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_directories_of_12de52b_analyse_to_the_committed_tables(tmp_path, experiment):
  source = os.path.join(FIXTURE, experiment)
  expected = _outputs(source)
  assert expected, f"the fixture {source} holds no tables"
  workdir = tmp_path / experiment
  shutil.copytree(source, workdir)
  for relative in expected:
    os.remove(workdir / relative)  # written again by today's analysis
  analysis.analyze(str(workdir))
  written = _outputs(workdir)
  # Tables added since: arms.csv, each arm's median and range over its seeds, where the runs
  # differ only in arm and seed (issue 45's seed figure over seeds).
  added = {"arms.csv"} if experiment == "speed" else set()
  # headroom.csv (issue 84), wherever the runs recorded per-layer telemetry.
  if _has_telemetry(source):
    added.add("headroom.csv")
  assert set(written) - set(expected) == added
  # observations.md's "Float16 headroom" section is added since (issue 84): the rest as it was.
  # (written with few enough runs to read them one by one, as the per-run prose is).
  text = written.get("observations.md", b"").decode()
  section = re.search(r"## Float16 headroom\n.*?(?=\n## |\Z)", text, re.S)
  if section:
    assert _has_telemetry(source) and "least headroom" in section.group(0)
    written["observations.md"] = (text[:section.start()] + text[section.end():].lstrip(
        "\n")).encode()
  assert {k: v for k, v in written.items() if k not in added} == expected


def _has_telemetry(directory) -> bool:
  """Whether a run below `directory` recorded a per-layer residual maximum."""
  for root, _, files in os.walk(directory):
    if "metrics.jsonl" in files:
      with open(os.path.join(root, "metrics.jsonl"), encoding="utf-8") as f:
        if "resid_absmax/layer_" in f.read():
          return True
  return False


def test_every_record_of_12de52b_reads_into_its_type_and_writes_back_the_same():
  """run.json, sweep.json and study.json as an older normstudy wrote them: each reads into its
  schema type and writes back to the same JSON object (keys this version does not know kept)."""
  read = {"run.json": schema.RunInfo, "sweep.json": schema.SweepRecord,
          "study.json": schema.StudyRecord}
  counts = dict.fromkeys(read, 0)
  for root, _, files in os.walk(FIXTURE):
    for name in files:
      if name in read:
        obj = json.loads(open(os.path.join(root, name), encoding="utf-8").read())
        assert read[name].from_json(obj).as_json() == obj, os.path.join(root, name)
        counts[name] += 1
  assert counts["run.json"] > 100 and counts["sweep.json"] == 4 and counts["study.json"] == 1
  unknown = {**schema.RunInfo().as_json(), "from_the_future": [1]}
  assert schema.RunInfo.from_json(unknown).as_json() == unknown


def test_a_run_that_never_started_reads_as_an_empty_run_info(tmp_path):
  info = rundir.RunDir(str(tmp_path)).info()
  assert info == schema.RunInfo() and info.status is None and info.needs_training(10)


@pytest.mark.slow
def test_a_run_finished_by_applied_updates_is_done_by_the_records_too(tmp_path):
  """One "run is done" rule: with train.count_skipped_steps=False the step finishes a float16
  run after num_steps applied updates, past num_steps train steps; run.json records the
  num_steps it finished at, so the records agree it needs no more training (before, they
  compared last_step with num_steps and sent it back to train), and the same command leaves it
  as it is."""
  workdir = tmp_path / "run"
  args = ("--config=configs/seed_figure.py:pre_norm_clip1", f"--workdir={workdir}",
          *runs.tiny_args(tmp_path / "tfds", num_steps=4),
          "--config.optimizer.loss_scale.initial_scale=1099511627776.0",  # 2^40: overflows first
          "--config.train.count_skipped_steps=False", "--config.train.max_consecutive_skips=100")
  runs.run_inline("normstudy.main", *args)
  info = rundir.RunDir(str(workdir)).info()
  assert info.status == schema.FINISHED and info.last_step > 4  # the skipped steps counted
  assert info.finished_num_steps == 4 and not info.needs_training(4)
  assert info.needs_training(6)  # extended: more updates to take
  before = (workdir / schema.METRICS).read_text()
  runs.run_inline("normstudy.main", *args)
  assert (workdir / schema.METRICS).read_text() == before
  # run.json written before finished_num_steps: finished at exactly num_steps train steps.
  legacy = schema.RunInfo(status=schema.FINISHED, last_step=4)
  assert not legacy.needs_training(4) and legacy.needs_training(5)

"""What a run writes, read back: directories an older normstudy wrote load and analyse to the
same tables today.

tests/fixtures/runs_12de52b/ holds a study, a learning-rate sweep, a search, a sweep of seeds,
a sweep of depths and a single run, trained and analysed by normstudy at commit 12de52b
(tests/fixtures/make_runs_12de52b.sh says how), without checkpoints and figures.
"""

import os
import shutil

import pytest

from normstudy import analysis

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
def test_directories_of_12de52b_analyse_to_the_tables_it_wrote(tmp_path, experiment):
  source = os.path.join(FIXTURE, experiment)
  expected = _outputs(source)
  assert expected, f"the fixture {source} holds no tables"
  workdir = tmp_path / experiment
  shutil.copytree(source, workdir)
  for relative in expected:
    os.remove(workdir / relative)  # written again by today's analysis
  analysis.analyze(str(workdir))
  assert _outputs(workdir) == expected

"""The tests' command processes forked from a server with the libraries imported
(tests/zygote.py) behave as `python -m` processes: exit status, output, a user error's one line,
an uncaught exception, signals and timeouts; and a command run in the test process
(tests/runs.run_inline) gives what the process gives: exit status, output, records."""

import os
import signal
import subprocess
import sys

import pytest

import runs

SEED = "configs/seed_figure.py:pre_norm_clip1"

needs_server = pytest.mark.skipif(os.environ.get("NORMSTUDY_TEST_FORK_SERVER") == "0",
                                  reason="NORMSTUDY_TEST_FORK_SERVER=0: no fork server")


def _real(module, *args):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=runs.REPO,
                        env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                        text=True, timeout=runs.bound(300))


def _forked(module, *args):
  server = runs._ForkServer.for_env(dict(os.environ, PYTHONUNBUFFERED="1"))
  assert server is not None, "the fork server is off (NORMSTUDY_TEST_FORK_SERVER=0)"
  count = server.count
  result = runs.run_module(module, *args, check=False)
  assert server.count == count + 1  # it went through the server, not a real process
  return result


REFUSED = [
    # A config refused after JAX loads: its config lines on stdout, one line on stderr, exit 2.
    ("normstudy.main", (f"--config={SEED}", "--config.model.placement=nope",
                        "--workdir=/proc/never")),
    ("normstudy.main", (f"--config={SEED}", "--print_config", "--workdir=/proc/never")),
    ("normstudy.sweep", ("--config=configs/seed_figure.py", "--axis=train.seed=x",
                         "--workdir=/proc/never")),
    ("json.tool", ("/nonexistent.json",)),  # argparse's refusal: usage and a message, exit 2
]


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("module,args", REFUSED)
def test_a_forked_command_exits_and_prints_as_python_m_does(module, args):
  real, forked = _real(module, *args), _forked(module, *args)
  assert (forked.returncode, forked.stdout, forked.stderr) == (
      real.returncode, real.stdout, real.stderr)
  assert real.returncode != 0 or module == "normstudy.main"


@needs_server
def test_an_uncaught_exception_is_a_traceback_and_exit_1_as_python_m_gives():
  args = ("-d", "/nonexistent.b64")  # base64's main opens the file unguarded
  real, forked = _real("base64", *args), _forked("base64", *args)
  assert forked.returncode == real.returncode == 1
  for result in (real, forked):
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
  assert forked.stderr.strip().splitlines()[-1] == real.stderr.strip().splitlines()[-1] == (
      "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent.b64'")


@needs_server
def test_a_started_command_takes_signals_and_a_hung_one_meets_its_timeout():
  endless = ("timeit", "-n", "10000000000", "pass")
  proc = runs.start_module(*endless)
  assert isinstance(proc, runs._ForkedProcess)
  with pytest.raises(subprocess.TimeoutExpired):
    proc.communicate(timeout=0.2)
  assert proc.poll() is None
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=runs.bound(60))
  assert proc.returncode == -signal.SIGTERM, stderr
  with pytest.raises(subprocess.TimeoutExpired):
    runs.run_module(*endless, timeout=0.5)  # killed, as subprocess.run kills on its timeout


def test_a_command_with_its_own_environment_is_a_real_process():
  env = dict(os.environ, NORMSTUDY_SOMETHING_ELSE="1")
  assert runs._ForkServer.for_env(dict(env, PYTHONUNBUFFERED="1")) is None
  proc = runs.start_module("json.tool", "/nonexistent.json", env=env)
  assert isinstance(proc, subprocess.Popen)
  proc.communicate(timeout=runs.bound(60))
  assert proc.returncode == 2


@needs_server
def test_a_command_whose_environment_differs_in_what_is_read_at_use_is_forked_with_it():
  # XLA_FLAGS among them: the child's backend starts with the child's flags, not the server's.
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=3"
  env = dict(os.environ, XLA_FLAGS=flags, STORAGE_EMULATOR_HOST="http://127.0.0.1:9")
  server = runs._ForkServer.for_env(dict(env, PYTHONUNBUFFERED="1"))
  assert server is runs._ForkServer.for_env(dict(os.environ, PYTHONUNBUFFERED="1"))
  count = server.count
  result = runs.run_module("tests.devices", env=env)
  assert server.count == count + 1 and result.stdout.split() == ["3"]
  assert runs.run_module("tests.devices").stdout.split() == ["1"]


@pytest.mark.slow
@needs_server
def test_a_change_of_this_process_environment_starts_the_server_again(monkeypatch):
  before = runs._ForkServer.for_env(dict(os.environ, PYTHONUNBUFFERED="1"))
  monkeypatch.setenv("NORMSTUDY_SOMETHING_ELSE", "1")
  after = runs._ForkServer.for_env(dict(os.environ, PYTHONUNBUFFERED="1"))
  assert after is not before and after.env["NORMSTUDY_SOMETHING_ELSE"] == "1"
  assert before.proc.wait(timeout=runs.bound(60)) == 0  # retired: it ended with no children


@pytest.mark.parametrize("module,args", REFUSED)
def test_a_command_inline_exits_and_prints_as_python_m_does(module, args):
  real, inline = _real(module, *args), runs.run_inline(module, *args, check=False)
  assert (inline.returncode, inline.stdout, inline.stderr) == (
      real.returncode, real.stdout, real.stderr)


def test_an_uncaught_exception_inline_is_a_traceback_and_exit_1():
  inline = runs.run_inline("base64", "-d", "/nonexistent.b64", check=False)
  lines = inline.stderr.strip().splitlines()
  assert inline.returncode == 1 and lines[0] == "Traceback (most recent call last):"
  assert lines[-1] == "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent.b64'"


@pytest.mark.slow
def test_commands_inline_one_after_another_train_what_their_processes_train(tmp_path):
  # Each command's own flags: the second's differ from the first's (a flag left defined or
  # parsed by the first would refuse the second or leak its values into it).
  args = (f"--config={SEED}", *runs.tiny_args(tmp_path / "tfds", num_steps=4, every=2))
  forked = runs.run_module("normstudy.main", *args, f"--workdir={tmp_path / 'forked'}")
  inline = runs.run_inline("normstudy.main", *args, f"--workdir={tmp_path / 'inline'}")
  assert inline.returncode == forked.returncode == 0
  assert runs.trajectory(tmp_path / "inline") == runs.trajectory(tmp_path / "forked")
  assert inline.stdout == forked.stdout.replace("forked", "inline")
  extended = runs.run_inline("normstudy.main", *args, f"--workdir={tmp_path / 'inline'}",
                             "--config.train.num_steps=6", "--config.train.log_every=1")
  assert "keeps the horizon of 4 steps" in extended.stderr
  assert [r["step"] for r in runs.trajectory(tmp_path / "inline")] == list(range(1, 7))
  refused = runs.run_inline("normstudy.main", *args, "--workdir=/proc/never",
                            "--config.train.num_steps=x", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0

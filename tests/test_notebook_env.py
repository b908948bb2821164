"""The notebook's install cell installs what the analysis imports: in an environment with only
those packages and Colab's (tests/fresh_env.py), the analysis imports and the training stack is
absent. The notebook itself runs there in test_pipeline.py (a study) and test_sweep.py (a sweep)."""

import subprocess

import fresh_env


def test_the_install_cell_names_what_the_analysis_needs_beyond_colab():
  assert fresh_env.install_cell_packages() == ["ml-collections", "absl-py"]


def test_the_analysis_imports_in_the_fresh_environment_and_jax_does_not(tmp_path):
  python = fresh_env.build(str(tmp_path / "env"))

  def imports(module):
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True,
                          cwd=tmp_path)

  result = imports("normstudy.analysis")
  assert result.returncode == 0, result.stderr[-2000:]
  for absent in ("jax", "flax", "tensorflow", "optax"):
    assert "No module named" in imports(absent).stderr, absent

"""A fresh virtual environment holding only what the notebook's install cell installs, plus what
Colab already has, and a Jupyter kernel that runs in it.

The environment is built offline from the distributions of this test environment: for each
distribution in the dependency closure of the install cell's packages (and Colab's), its
top-level files are linked into the new environment's site-packages; normstudy itself is linked
as its package directory alone (the cell installs it with --no-deps). A module the analysis
imports that is in neither list is then missing there, as it would be in Colab.
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

from packaging.requirements import Requirement

import runs

# What a Colab runtime has that the analysis and the notebook use (the install cell relies on
# them), and what any Jupyter kernel needs.
COLAB_HAS = ("numpy", "pandas", "matplotlib", "scipy", "ipython", "ipykernel")
NOTEBOOK = os.path.join(runs.REPO, "notebooks", "compare_runs.ipynb")


def install_cell_packages(notebook_path: str = NOTEBOOK) -> list:
  """The packages the notebook's install cell names in its `pip install` lines, without normstudy
  itself (its --no-deps install)."""
  cells = json.load(open(notebook_path, encoding="utf-8"))["cells"]
  source = next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and "pip" in "".join(c["source"]))
  names = []
  for line in re.findall(r'"pip",\s*f?"install ([^"]*)"', source):
    if "--no-deps" in line:
      continue
    names += [w for w in line.split() if not w.startswith("-")]
  return names


def _closure(names) -> dict:
  """distribution name -> Distribution, for `names` and everything they require."""
  found, todo = {}, list(names)
  while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in found:
      continue
    dist = importlib.metadata.distribution(name)
    found[key] = dist
    for text in dist.requires or []:
      requirement = Requirement(text)
      if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
        todo.append(requirement.name)
  return found


def build(directory: str) -> str:
  """Creates the environment in `directory`; returns its python."""
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", directory], check=True)
  python = os.path.join(directory, "bin", "python")
  site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        check=True, capture_output=True, text=True).stdout.strip()
  for dist in _closure(install_cell_packages() + list(COLAB_HAS)).values():
    root = dist.locate_file("")
    for top in sorted({str(f).split("/")[0] for f in dist.files or []}):
      if top in ("..", "__pycache__") or top.endswith(".pth"):
        continue
      target = os.path.join(site, top)
      if os.path.exists(os.path.join(root, top)) and not os.path.lexists(target):
        os.symlink(os.path.join(root, top), target)
  os.symlink(os.path.join(runs.REPO, "normstudy"), os.path.join(site, "normstudy"))
  return python


def kernel(directory: str, python: str) -> str:
  """A kernelspec named `fresh` under `directory`/kernels running `python`; returns the path
  to put on JUPYTER_PATH."""
  spec = os.path.join(directory, "kernels", "fresh")
  os.makedirs(spec, exist_ok=True)
  with open(os.path.join(spec, "kernel.json"), "w", encoding="utf-8") as f:
    json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "fresh", "language": "python"}, f)
  return directory


def execute_notebook(workdir, tmp_path):
  """Runs notebooks/compare_runs.ipynb headless against `workdir` in a fresh environment built
  under `tmp_path`; any failing cell fails. Returns the executed notebook."""
  import nbclient
  import nbformat
  directory = os.path.join(str(tmp_path), "fresh_env")
  python = build(directory)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  saved = {k: os.environ.get(k) for k in ("NORMSTUDY_WORKDIR", "JUPYTER_PATH")}
  os.environ["NORMSTUDY_WORKDIR"] = str(workdir)
  os.environ["JUPYTER_PATH"] = kernel(directory, python)
  try:
    nbclient.NotebookClient(nb, kernel_name="fresh", timeout=int(runs.bound(600)),
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  return nb

"""The package's shape: every module imports in one process (no duplicate absl flags), the import
graph has no cycles and no upward imports, and the analysis needs no training stack."""

import ast
import os
import pkgutil
import subprocess
import sys

import normstudy
import runs

PACKAGE = os.path.dirname(normstudy.__file__)

# The pure core: functions of arrays and configs. It never imports the edges below it.
CORE = {"errors", "registry", "config", "placements", "precision", "optimizer", "model", "loss",
        "telemetry", "steps", "labels", "life", "per_run", "techniques", "platform", "memory",
        "search"}
# Side effects: files, devices, processes, flags.
EDGES = {"data", "synthetic", "sharding", "execution", "checkpoints", "rundir", "storage",
         "metrics", "recorder", "train", "workers",
         "orchestrate", "study", "sweep", "grid", "main", "analyze", "cli", "validation",
         "analysis", "aot", "compile"}
# Entry modules: flags and a call. None imports another.
ENTRIES = {"main", "study", "sweep", "analyze", "compile"}


def _modules():
  names = []
  for info in pkgutil.walk_packages([PACKAGE], prefix="normstudy."):
    if not info.name.endswith("__main__"):
      names.append(info.name)
  return names


def _imports(path):
  """normstudy modules a file imports (top level and inside functions), as top-level names."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("normstudy"):
      parts = node.module.split(".")
      if len(parts) > 1:
        found.add(parts[1])
      else:
        found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("normstudy."):
          found.add(alias.name.split(".")[1])
  return found


def test_every_module_imports_in_one_process():
  code = "import importlib\n" + "\n".join(f"importlib.import_module({m!r})" for m in _modules())
  result = subprocess.run([sys.executable, "-c", code], cwd=runs.REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]


def test_core_never_imports_an_edge_and_the_graph_has_no_cycle():
  graph = {}
  for name in os.listdir(PACKAGE):
    if name.endswith(".py") and name not in ("__init__.py",):
      graph[name[:-3]] = _imports(os.path.join(PACKAGE, name)) - {name[:-3]}
  analysis_dir = os.path.join(PACKAGE, "analysis")
  graph["analysis"] = set().union(*(
      _imports(os.path.join(analysis_dir, f)) for f in os.listdir(analysis_dir)
      if f.endswith(".py"))) - {"analysis"}
  assert set(graph) == CORE | EDGES, "classify every module as core or edge"
  for module in CORE:
    assert not graph[module] & EDGES, (module, graph[module] & EDGES)
  for module, imported in graph.items():  # entry modules are programs, never libraries
    assert not imported & ENTRIES, (module, imported & ENTRIES)

  visiting, done = set(), set()

  def visit(node, path):
    assert node not in visiting, f"import cycle: {' -> '.join(path + [node])}"
    if node in done:
      return
    visiting.add(node)
    for child in sorted(graph.get(node, ())):
      visit(child, path + [node])
    visiting.remove(node)
    done.add(node)

  for node in sorted(graph):
    visit(node, [])


BLOCK_TRAINING_STACK = """
import sys
class Blocker:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "grain",
                              "clu", "tensorflow_datasets"):
      raise ImportError(f"{name} is blocked: the analysis must not need it")
sys.meta_path.insert(0, Blocker())
"""


def test_the_analysis_needs_no_training_stack(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  (run / "metrics.jsonl").write_text(
      '{"step": 1, "loss": 3.0, "loss_scale": 128.0, "attn_logit_max/layer_0": 2.0}\n'
      '{"step": 2, "loss": 2.0, "loss_scale": 128.0, "attn_logit_max/layer_0": 3.0}\n')
  code = BLOCK_TRAINING_STACK + f"""
from normstudy import analysis
outputs = analysis.analyze({str(tmp_path)!r})
print(sorted(outputs))
"""
  result = subprocess.run([sys.executable, "-c", code], cwd=runs.REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "layers_attn_logit_max" in result.stdout


# Longest a function or class of the package may be: one screen, read top to bottom.
MAX_LINES = 80


def test_no_function_or_class_is_longer_than_a_screen():
  long = []
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
              long.append(f"{os.path.relpath(path, PACKAGE)}:{node.lineno} {node.name} ({lines})")
  assert not long, long

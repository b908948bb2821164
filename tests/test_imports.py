"""The package's shape: the layers are folders and each folder's rule holds, the import graph has
no cycles, every module imports in one process (no duplicate absl flags), and the analysis needs
no training stack."""

import ast
import os
import pkgutil
import re
import runpy
import subprocess
import sys

import pytest

import normstudy
import runs

PACKAGE = os.path.dirname(normstudy.__file__)

# What each layer (a folder of the package) may import besides itself, bottom up: the records
# (what a run writes) import only the errors, so the engine that writes them and the analysis
# that reads them share one definition; the pure core imports the records' schema; the analysis
# reads records and never the training stack.
LAYERS = {
    "records": {"errors"},
    "core": {"errors", "records"},
    "data": {"errors", "records", "core"},
    "engine": {"errors", "records", "core", "data"},
    "experiments": {"errors", "records", "core", "data", "engine"},
    "analysis": {"errors", "records"},
}
# Modules at the top: `errors` (every layer's), the commands (each a program: `python -m
# normstudy.<name>`) and what they share. A command imports any layer; none imports another.
LEAF = "errors"
TRAINING_STACK = ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "grain", "clu",
                  "tensorflow_datasets")


def _modules():
  names = []
  for info in pkgutil.walk_packages([PACKAGE], prefix="normstudy."):
    if not info.name.endswith("__main__"):
      names.append(info.name)
  return names


def _tree(path):
  return ast.parse(open(path, encoding="utf-8").read())


def _imports(path):
  """(normstudy modules, other top-level packages) a file imports, at its top level and inside
  functions; normstudy modules as dotted names below normstudy ("core.config", "errors")."""
  ours, others = set(), set()
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "normstudy":
        ours.update(alias.name for alias in node.names)
      elif node.module.startswith("normstudy."):
        module = node.module[len("normstudy."):]
        package = os.path.join(PACKAGE, *module.split("."))
        if os.path.isdir(package):  # `from normstudy.core import config`: the modules named
          ours.update(f"{module}.{alias.name}" for alias in node.names)
        else:
          ours.add(module)
      else:
        others.add(node.module.split(".")[0])
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("normstudy."):
          ours.add(alias.name[len("normstudy."):])
        else:
          others.add(alias.name.split(".")[0])
  return ours, others


def _graph():
  """{module: (normstudy modules it imports, other packages)} of every module of the package,
  named below normstudy ("core.config", "main", "analysis.stats"; a package's __init__ by the
  package's name)."""
  graph = {}
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        relative = os.path.relpath(os.path.join(root, name), PACKAGE)[:-3].replace(os.sep, ".")
        module = relative[:-len(".__init__")] if relative.endswith("__init__") else relative
        if module != "__init__":
          graph[module] = _imports(os.path.join(root, name))
  return graph


def _layer(module: str) -> str:
  return module.split(".")[0]


def _is_command(module: str) -> bool:
  """Whether `module` is a program: a file at the top with `if __name__ == "__main__":`."""
  path = os.path.join(PACKAGE, f"{module}.py")
  if not os.path.isfile(path):
    return False
  tree = _tree(path)
  return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
             for node in tree.body)


def test_every_module_imports_in_one_process():
  code = "import importlib\n" + "\n".join(f"importlib.import_module({m!r})" for m in _modules())
  result = subprocess.run([sys.executable, "-c", code], cwd=runs.REPO, capture_output=True,
                          text=True, timeout=runs.bound(300))
  assert result.returncode == 0, result.stderr[-3000:]


def test_the_top_holds_the_commands_the_layers_and_little_else():
  top = sorted(n[:-3] for n in os.listdir(PACKAGE) if n.endswith(".py") and n != "__init__.py")
  folders = sorted(n for n in os.listdir(PACKAGE) if os.path.isfile(
      os.path.join(PACKAGE, n, "__init__.py")))
  assert folders == sorted(LAYERS)
  commands = [name for name in top if _is_command(name)]
  assert set(commands) >= {"main", "study", "sweep", "analyze", "compile"}
  helpers = set(top) - set(commands) - {LEAF}
  assert len(helpers) <= 1, f"only one module of helpers beside the commands: {helpers}"


def test_each_layer_imports_only_the_layers_below_it():
  graph = _graph()
  for module, (ours, _) in graph.items():
    layer = _layer(module)
    imported = {_layer(m) for m in ours} - {layer}
    if layer in LAYERS:
      assert imported <= LAYERS[layer], (module, imported - LAYERS[layer])
    elif module == LEAF:
      assert not ours, (module, ours)
    else:  # a command or the commands' helpers
      commands = {m for m in ours if _is_command(m)}
      assert not commands, f"{module} imports the command(s) {commands}"
      if not _is_command(module):
        assert "analysis" not in imported, f"{module}: only commands draw (import the analysis)"


def test_no_module_name_repeats_across_the_folders():
  """A module's name says its layer: `ladder_runs` (experiments) and `ladder_report` (analysis)
  beside the `ladder` command, never three `ladder.py`."""
  seen = {}
  for module in _graph():
    if module in LAYERS:
      continue
    seen.setdefault(module.rsplit(".", 1)[-1], []).append(module)
  assert not {name: where for name, where in seen.items() if len(where) > 1}


def _readme_map():
  """{folder: (words of its entry, the layers its entry says it imports)} from the Architecture
  block of docs/development.md."""
  text = open(os.path.join(runs.REPO, "docs", "development.md"), encoding="utf-8").read()
  block = text[text.index("```\nnormstudy/\n"):]
  block = block[:block.index("\n```", 4)]
  entries, current = {}, None
  for line in block.splitlines():
    match = re.match(r"  (\w+)/\s", line)
    if match:
      current = match.group(1)
      entries[current] = line[match.end():]
    elif current and line.startswith(" " * 16):
      entries[current] += " " + line
    else:
      current = None
  found = {}
  for folder, entry in entries.items():
    words, _, imports = entry.rpartition(" imports ")
    found[folder] = (set(re.findall(r"\w+", words)),
                     set(re.findall(r"\w+", imports.split("(")[0])))
  return found


def test_the_layer_map_is_true():
  """docs/development.md's map lists every module of each folder and, exactly, the layers that folder's
  modules import."""
  graph, stated = _graph(), _readme_map()
  assert set(stated) == set(LAYERS)
  for layer, (words, imports) in stated.items():
    modules = {m.split(".", 1)[1] for m in graph if m.startswith(layer + ".")}
    assert modules <= words, (layer, modules - words)
    actual = set()
    for module, (ours, _) in graph.items():
      if _layer(module) == layer:
        actual |= {_layer(m) for m in ours} - {layer}
    assert imports == actual, (layer, imports, actual)


def test_records_and_the_analysis_never_import_the_training_stack():
  for module, (_, others) in _graph().items():
    if _layer(module) in ("records", "analysis"):
      assert not others & set(TRAINING_STACK), (module, others & set(TRAINING_STACK))


def test_the_import_graph_has_no_cycle():
  graph = {module: {m for m in ours if m != module} for module, (ours, _) in _graph().items()}
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


BLOCK_TRAINING_STACK = f"""
import sys
class Blocker:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {TRAINING_STACK!r}:
      raise ImportError(f"{{name}} is blocked: the analysis must not need it")
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
                          text=True, timeout=runs.bound(300))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "layers_attn_logit_max" in result.stdout


# Longest a function or a class of the package may be: one screen, read top to bottom. A class
# is held to it whole (its docstring, fields and methods), so state that outgrows a screen is
# split into frozen dataclasses or NamedTuples of fields and functions over them.
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


def test_the_commands_import_no_heavy_stack_before_their_flags_parse():
  """`--help` must not wait for jax, pandas or matplotlib (once 4-12 s for analyze, sweep and
  study; issue 45): the commands import them inside main(). Nor must the grid module that a sweep
  or study checks its command line with (a mistyped config once took 4 s to refuse: the legend
  labels imported the placements, and they JAX). The constants their flags need agree with the
  modules that own them."""
  import subprocess
  import sys
  code = ("import sys, normstudy.main, normstudy.study, normstudy.sweep, normstudy.analyze, "
          "normstudy.ladder, normstudy.techniques, normstudy.compile, normstudy.context_gap, "
          "normstudy.experiments.grid, normstudy.records.storage; "
          "print(sorted(m for m in ('jax', 'pandas', 'matplotlib', 'scipy') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.stdout.strip() == "[]", out.stdout
  from normstudy import analyze, sweep
  from normstudy.analysis import plots
  from normstudy.experiments import grid
  assert analyze.DEFAULT_SMOOTHING == plots.DEFAULT_SMOOTHING
  assert sweep.MAX_RUNS_PER_PROGRAM == grid.MAX_RUNS_PER_PROGRAM


@pytest.mark.parametrize("command,args", [
    ("normstudy.main", ["--config=configs/seed_figure.py:pre_norm_clip1"]),
    ("normstudy.sweep", ["--config=configs/seed_figure.py:pre_norm_clip1",
                         "--axis=train.seed=0,1"]),
    ("normstudy.study", ["--config=configs/seed_figure.py"]), ("normstudy.analyze", [])])
def test_a_workdir_url_that_cannot_be_used_is_refused_before_the_training_stack_loads(
    command, args):
  """A bad --workdir URL (another scheme, no bucket, a name no bucket can have) is one line in a
  fraction of a second: the commands check it (normstudy.records.storage.check_workdir) before
  they import JAX or pandas."""
  for workdir, line in (("s3://b/x", "error: --workdir='s3://b/x': s3:// is not supported; "
                                     "allowed: a local path or gs://BUCKET/PATH"),
                        ("gs:///x", "error: --workdir='gs:///x' names no bucket; allowed: "
                                    "gs://BUCKET/PATH"),
                        # Issue 78: once "'gs:': gs::// is not supported", and a 72 s wait.
                        ("gs://", "error: --workdir='gs://' names no bucket; allowed: "
                                  "gs://BUCKET/PATH"),
                        ("gs://Bad_Bucket!/x", "error: --workdir='gs://Bad_Bucket!/x': "
                         "'Bad_Bucket!' is not a Cloud Storage bucket name; allowed: lowercase "
                         "letters, digits, '-', '_' and '.', beginning and ending with a letter "
                         "or a digit")):
    argv = [command, f"--workdir={workdir}", *args]
    code = ("import runpy, sys\n"
            f"sys.argv = {argv!r}\n"
            "try:\n"
            f"  runpy.run_module({command!r}, run_name='__main__', alter_sys=True)\n"
            "except SystemExit as e:\n"
            "  print('exit', e.code, 'jax' in sys.modules, 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stderr.strip().splitlines() == [line], out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "exit 2 False False", out.stdout


def test_every_config_file_is_one_experiment_and_every_make_target_is_one_rule():
  """Issue 87: every config file, loaded as the commands load it, yields an Experiment whose
  get_config is the file's (no exemption) and builds each of its arms; the analysis's reports
  are the ones an experiment may name; every make target of an experiment is the one pattern
  rule running normstudy.run on configs/<its config>.py."""
  from normstudy import analysis
  from normstudy.core import experiment
  from normstudy.experiments import grid
  configs = os.path.join(runs.REPO, "configs")
  names = sorted(n for n in os.listdir(configs) if n.endswith(".py") and n != "__init__.py")
  assert len(names) >= 28
  for name in names:
    path = os.path.join(configs, name)
    declared = grid.load_experiment(path)
    assert isinstance(declared, experiment.Experiment), name
    assert declared.kind in experiment.KINDS, name
    get_config = runpy.run_path(path)["get_config"]
    assert getattr(get_config, "__func__", None) is experiment.Experiment.get_config, name
    for arm in declared.arms:
      assert declared.get_config(arm).label == declared.arms[arm][0], (name, arm)
  assert tuple(r.name for r in analysis.REPORTS) == experiment.REPORTS
  makefile = open(os.path.join(runs.REPO, "Makefile"), encoding="utf-8").read()
  recipes = re.findall(r"^\t[^\n]*?-m (normstudy\.\w+)", makefile, re.M)
  assert recipes.count("normstudy.run") == 1, recipes
  for other in ("normstudy.sweep", "normstudy.study", "normstudy.ladder", "normstudy.drift",
                "normstudy.techniques", "normstudy.context_gap", "normstudy.forecast"):
    assert other not in recipes, other
  targets = re.search(r"^EXPERIMENTS := ((?:[^\n]*\\\n)*[^\n]*)", makefile, re.M).group(1)
  targets = targets.replace("\\\n", " ").split()
  assert len(targets) >= 20
  for target in targets:  # each names a config file that exists (its own or by CONFIG)
    own = re.search(rf"^(?:[\w-]+ )*{re.escape(target)}(?: [\w-]+)*: CONFIG = (\w+)$",
                    makefile, re.M)
    config = own.group(1) if own else target.replace("-", "_")
    assert os.path.isfile(os.path.join(configs, config + ".py")), target


def test_importing_the_package_has_no_side_effects():
  """Issue 87: `import normstudy` (a notebook's, a library user's) sets no environment variable,
  installs no signal handler and defines no attribute besides its docstring's."""
  code = ("import os, signal, sys\n"
          "env, handler = dict(os.environ), signal.getsignal(signal.SIGINT)\n"
          "sys.argv = ['-m']\n"  # as `python -m normstudy.<command>` imports the package
          "import normstudy\n"
          "assert dict(os.environ) == env and signal.getsignal(signal.SIGINT) is handler\n"
          "print(sorted(n for n in vars(normstudy) if not n.startswith('__')))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=runs.REPO, check=True)
  assert out.stdout.strip() == "[]", out.stdout


def test_no_module_tests_a_parametrization_by_its_name():
  """Issue 87: parametrization names were tested by hand in 5 files outside their module; each
  caller reads the registered object's properties (normstudy.core.parametrizations)."""
  from normstudy.core import parametrizations
  names = "|".join(parametrizations.NAMES)
  by_name = re.compile(rf"parametrization\s*(==|!=)\s*[\"']({names})[\"']"
                       rf"|parametrization\s+(not\s+)?in\s*\(\s*[\"']({names})[\"']"
                       rf"|[\"']({names})[\"']\s*(==|!=)\s*\w*parametrization\b")
  found = []
  for root, _, files in os.walk(os.path.join(runs.REPO, "normstudy")):
    for name in files:
      path = os.path.join(root, name)
      if name.endswith(".py") and not path.endswith(os.path.join("core", "parametrizations.py")):
        text = open(path, encoding="utf-8").read()
        found += [f"{os.path.relpath(path, runs.REPO)}: {m.group(0)}"
                  for m in by_name.finditer(text)]
  assert not found, found


def test_benchmarks_are_at_most_eight_scripts_sharing_code_only_through_the_package():
  """Issue 87: benchmarks/ was 17 scripts with a hidden library (throughput.py imported by
  three others) and two basenames of the package's. Now at most 8 scripts, none named as a
  package module, none importing another script (only normstudy, configs and libraries), each
  with a docstring that says its question, each listed in benchmarks/README.md."""
  folder = os.path.join(runs.REPO, "benchmarks")
  scripts = sorted(n for n in os.listdir(folder) if n.endswith((".py", ".sh")))
  assert len(scripts) <= 8, scripts
  package = {name.rsplit(".", 1)[-1] for name in _graph()}
  own = {os.path.splitext(n)[0] for n in scripts}
  assert not own & package, own & package
  readme = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
  for name in scripts:
    assert f"`{name}" in readme, name
    if not name.endswith(".py"):
      continue
    tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
    assert ast.get_docstring(tree), name
    for node in ast.walk(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
      for imported in names:
        top = imported.split(".")[0]
        assert top not in own or top == os.path.splitext(name)[0], (name, imported)

"""`make survival` at the size issue 46 timed it, in another commit's tree and in this one, in one
sitting: what the step loop, the bias gradients and the worker pool did for that experiment.

  python benchmarks/survival_then.py [--base 12de52b] [--order base,this] [--keep DIR]

Issue 46 measured `make survival` at 18.5 minutes: 216 runs of 120 steps (6 arms x 6 seeds, a
search of 5 rounds from [0.1, 1]), the experiment as the Makefile and configs/survival.py of
12de52b defined it. Since then issue 41 made the experiment larger (480-step runs, a probe round,
a seventh arm; 65 minutes, docs/throughput.md), so today's `make survival` is not the same
experiment. This script runs the old one both ways:
  - base: the --base commit's own `make survival` command (read from its Makefile with
    `make -n`), in an export of that commit, with this interpreter;
  - this: the same command line in this tree, with a config file that is this tree's
    configs/survival.py restricted to the base's arms and the base's run length (its
    SWEEP_VARIANTS and NUM_STEPS, read from the base tree).
Each starts from an empty compilation cache (as on a clean clone) and its default workers. What
still differs is what this tree changed on purpose: the failure rule (issue 41: a skip the fp16
scaler recovers from is no death, so a search may take other branches) and the float16 bias
gradients' last bits (docs/throughput.md), so the two runs need not train the same runs; the
printed run-steps say how much each trained. Printed: each side's wall time, runs, run-steps and
run-steps per second, and the ratio base / this.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time

from ab import export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def survival_argv(tree: str) -> list:
  """The `normstudy.sweep` command of `make survival` in `tree`'s Makefile, this interpreter
  in place of the tree's .venv."""
  dry = subprocess.run(["make", "-n", "--no-print-directory", "-C", tree, "survival",
                        f"PY={sys.executable}"], check=True, capture_output=True, text=True)
  lines = [line for line in dry.stdout.splitlines() if "-m normstudy.sweep" in line]
  if not lines:
    sys.exit(f"error: no `normstudy.sweep` command under `make survival` in {tree}")
  return shlex.split(lines[0])


def base_design(tree: str) -> tuple:
  """(SWEEP_VARIANTS, NUM_STEPS) of `tree`'s configs/survival.py."""
  out = subprocess.run([sys.executable, "-c", "from configs import survival as s; "
                        "print(','.join(s.SWEEP_VARIANTS)); print(s.NUM_STEPS)"],
                       cwd=tree, check=True, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": tree})
  names, steps = out.stdout.split()
  return tuple(names.split(",")), int(steps)


def this_config(variants: tuple, num_steps: int, into: str) -> str:
  """A config file: this tree's configs/survival.py with the base's arms and run length."""
  path = os.path.join(into, "survival_then.py")
  with open(path, "w", encoding="utf-8") as f:
    f.write(textwrap.dedent(f"""\
        from configs import survival
        from configs.survival import VARIANTS, get_config  # noqa: F401
        SWEEP_VARIANTS = STUDY_VARIANTS = {variants!r}
        SWEEP_SETTINGS = {{**survival.SWEEP_SETTINGS, "train.num_steps": {num_steps},
                          "train.eval_every": {num_steps}, "train.checkpoint_every": {num_steps}}}
        """))
  return path


def run_steps(workdir: str) -> tuple:
  """(runs, run-steps): the runs under `workdir` (each directory with a metrics.jsonl, the
  record both trees write) and the sum of their last recorded steps (records come every
  train.log_every steps and at a halt, so within log_every of the steps trained)."""
  runs = steps = 0
  for directory, _, files in os.walk(workdir):
    if "metrics.jsonl" not in files:
      continue
    last = 0
    with open(os.path.join(directory, "metrics.jsonl"), encoding="utf-8") as f:
      for line in f:
        try:
          last = max(last, int(json.loads(line).get("step", 0)))
        except (ValueError, TypeError):
          continue
    runs, steps = runs + 1, steps + last
  return runs, steps


def timed(argv: list, tree: str, workdir: str, cache: str, log: str) -> float:
  argv = [a for a in argv if not a.startswith("--workdir=")] + [f"--workdir={workdir}"]
  started = time.perf_counter()
  with open(log, "w", encoding="utf-8") as out:
    subprocess.run(argv, cwd=tree, check=True, stdout=out, stderr=subprocess.STDOUT,
                   env={**os.environ, "PYTHONPATH": tree, "JAX_COMPILATION_CACHE_DIR": cache})
  return time.perf_counter() - started


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--base", default="12de52b")
  parser.add_argument("--order", default="base,this", help="which side runs first")
  parser.add_argument("--keep", default="", help="keep both searches' directories here")
  args = parser.parse_args(argv)
  order = args.order.split(",")
  if sorted(order) != ["base", "this"]:
    sys.exit(f"error: --order={args.order!r}; allowed: base,this or this,base")
  with tempfile.TemporaryDirectory() as tmp:
    out = args.keep or tmp
    os.makedirs(out, exist_ok=True)
    base_tree = os.path.join(tmp, "base")
    os.makedirs(base_tree)
    export(args.base, base_tree)
    variants, num_steps = base_design(base_tree)
    command = survival_argv(base_tree)
    config = this_config(variants, num_steps, tmp)
    sides = {
        "base": (command, base_tree),
        "this": ([a if not a.startswith("--config=") else f"--config={config}"
                  for a in command], ROOT),
    }
    print(f"base {args.base}: {len(variants)} arms, {num_steps}-step runs; command: "
          + " ".join(command[1:]), flush=True)
    seconds = {}
    for name in order:
      cmd, tree = sides[name]
      workdir = os.path.join(out, name)
      seconds[name] = timed(cmd, tree, workdir, os.path.join(tmp, f"cache_{name}"),
                            os.path.join(out, f"{name}.log"))
      runs, steps = run_steps(workdir)
      rate = f", {steps / seconds[name]:.1f} run-steps/s" if steps else ""
      print(f"{name}: {seconds[name]:.0f} s ({seconds[name] / 60:.1f} min), {runs} runs, "
            f"{steps} run-steps{rate}; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"base / this: {seconds['base'] / seconds['this']:.2f}x the wall time")


if __name__ == "__main__":
  main()

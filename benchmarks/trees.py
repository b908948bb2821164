"""Is this checkout faster than another commit, and does it keep the committed bits? Each
subcommand exports the other commit with `git archive` and runs both trees in one sitting.

  python benchmarks/trees.py [step] [--base HEAD~1] [--sizes seed,S,M] [--rounds 3] [--steps 15]
  python benchmarks/trees.py bits [--base HEAD~1] [--steps 120] [--only SUBSTRING] [--workers 2]
  python benchmarks/trees.py search [--base HEAD~1] [--rounds 2] [--workers 0] [--rung 4,32]

step: This checkout's train step against another commit's, timed alternately in one sitting.

The other commit is exported with `git archive` to a temporary directory. Each round times every
size once in each tree, in a fresh process each time and in alternating order (the machine's
speed drifts; alternation spreads the drift over both sides). A timing is the median step time
of --steps steps after compilation of normstudy's engine as `normstudy.main` runs it (one run,
K = 1): `seed` is the seed figure's recipe (float16 encoder, width 64, 4 layers), S and M the
sizes of configs/benchmark.py (float32 decoders). Printed per size: the median over rounds
of each tree's ms/step and the speed-up (base time / this time).

bits: Whether a change keeps the committed experiments' bits: committed runs trained in another
commit's tree and in this one, their records compared value for value.

A change meant only to make a step faster (a fusion boundary, a layout) must leave every
committed trajectory as it was, or the committed experiments no longer re-run from the code to
what they wrote. Each case is the command a committed sweep.json gives for one of its runs
(survival in float16, float32 and bfloat16, each placement family, the techniques that change the
attention or the norms; runs that finish and runs that halt, so the locate pass runs too), cut to
--steps steps with telemetry every 50, plus a ladder rung in float16 and bfloat16 and the tiny
LM. Each runs as `python -m normstudy.main` in an export of --base (`git archive`) and in this
checkout, with the compilation cache off; the records (metrics.jsonl, timings aside) must be
equal. Prints SAME or DIFF per case (for DIFF the first step and keys that differ); exits 1 if
any case differs. About 15 minutes on 2 cores.

search: A whole search (its rounds, workers, programs) here against another commit's, timed
alternately in one sitting: what a search pays beside its steps (tracing, loading compiled
programs, starting workers) and what this tree saves of it.

The search is one rung of `make ladder` (configs/ladder.py: the ladder's 4 arms x 2 seeds on
Shakespeare, 120-step runs, its Ladder's search: 3 rounds and probe round), at --rung
(num_layers,d_model). The other commit is exported with `git archive`. Each tree first runs the
search once untimed (its programs then sit in the persistent compile cache, as on a machine that
has run it before); then each round runs it once in each tree, in a fresh process each time and in
alternating order. Printed: every timing, each tree's median wall time, the speed-up (base /
this), and whether the two trees' critical_lr.csv and runs.csv are byte-identical (they are when
neither tree changed the numerics).
"""

import argparse
import concurrent.futures
import filecmp
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import ladder  # noqa: E402  (this tree's ladder: the rung both trees search)

# Each subcommand's question (its --help): the first line of its part of the docstring.
_QUESTIONS = {name: re.search(rf"^{name}: (.*)$", __doc__, re.M).group(1)
              for name in ("step", "bits", "search")}



# ---- step --------------------------------------------------------------------------------------

STEP_SIZES = ("seed", "S", "M")

# Runs in the tree under test, with only APIs both trees share.
_TIMER = r"""
import json, statistics, sys, time
tree, size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/benchmarks"]
import jax, numpy as np
from normstudy.engine import sharding
try:  # configs/benchmark.py's sizes since benchmarks/ became 8 scripts; throughput.py's before
  from configs import benchmark, seed_figure
  config = seed_figure.get_config() if size == "seed" else benchmark.get_config(size)
except ImportError:
  import throughput
  config = throughput.seed_config() if size == "seed" else throughput.size_config(size)
m, rng = config.model, np.random.default_rng(0)
shape = (1, config.train.batch_size, m.max_len)
batch = {"tokens": rng.integers(0, m.vocab_size, shape).astype(np.int32)}
if not m.causal:
  batch["mask"] = rng.random(batch["tokens"].shape) < config.data.mask_prob
mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
try:  # normstudy.engine.execution since the commit that made it; sharding's functions before
  from normstudy.engine import execution
  program = execution.ProgramSteps(config, mesh, num_runs=1)
  state, step = program.initial([config]), program.train
except ImportError:
  state, shardings = sharding.create_states([config], mesh)
  step = sharding.jit_train_step(config, mesh, shardings, num_runs=1)
batch = sharding.global_batch(mesh, batch)
state, metrics = step(state, batch)  # compiles
jax.block_until_ready(metrics)
times = []
for _ in range(steps):
  start = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  times.append(time.perf_counter() - start)
print(json.dumps({"ms": 1e3 * statistics.median(times)}))
"""


def export(rev: str, into: str) -> str:
  """The tree of commit `rev` under `into`."""
  archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True)
  subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
  return into


def time_step(tree: str, size: str, steps: int) -> float:
  out = subprocess.run([sys.executable, "-c", _TIMER, tree, size, str(steps)], check=True,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree})
  return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def step(argv=None):
  parser = argparse.ArgumentParser(prog="trees.py step", description=_QUESTIONS["step"])
  parser.add_argument("--base", default="HEAD~1", help="the commit to compare against")
  parser.add_argument("--sizes", default="seed,S,M", help="comma-separated, from: seed, S, M")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=15, help="timed steps per measurement")
  parser.add_argument("--json", default=None, help="also write the figures to this file")
  args = parser.parse_args(argv)
  sizes = args.sizes.split(",")
  if any(s not in STEP_SIZES for s in sizes):
    sys.exit(f"error: --sizes={args.sizes} names a size not in: {', '.join(STEP_SIZES)}")
  if args.rounds < 1 or args.steps < 1:
    sys.exit(f"error: --rounds={args.rounds} and --steps={args.steps} must be at least 1")
  rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.base],
                       capture_output=True, text=True)
  if rev.returncode:
    sys.exit(f"error: --base={args.base} is not a commit of {ROOT}")
  with tempfile.TemporaryDirectory() as tmp:
    trees = {"base": export(args.base, tmp), "this": ROOT}
    times = {(size, side): [] for size in sizes for side in trees}
    for round_ in range(args.rounds):
      for size in sizes:
        order = ("base", "this") if round_ % 2 == 0 else ("this", "base")
        for side in order:
          times[size, side].append(time_step(trees[side], size, args.steps))
        print(f"round {round_ + 1}/{args.rounds} {size}: base {times[size, 'base'][-1]:.1f} ms, "
              f"this {times[size, 'this'][-1]:.1f} ms", flush=True)
  print(f"\nbase = {args.base} ({rev.stdout.strip()}), this = the working tree; "
        f"median of {args.rounds} rounds, ms per step")
  print(f"{'size':<6}{'base':>10}{'this':>10}{'speed-up':>10}")
  results = []
  for size in sizes:
    base, this = (statistics.median(times[size, side]) for side in ("base", "this"))
    results.append({"size": size, "base_ms": base, "this_ms": this, "speedup": base / this,
                    "base_all": times[size, "base"], "this_all": times[size, "this"]})
    print(f"{size:<6}{base:>10.1f}{this:>10.1f}{base / this:>9.2f}x")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"base": args.base, "rows": results}, f, indent=2)


# ---- bits --------------------------------------------------------------------------------------

# (committed sweep directory, its runs): the arms differ in where their norms, relaxations and
# techniques sit; lr 1 halts (the non-finite locate pass runs).
COMMITTED = (
    ("docs/survival", ("pre_norm_clip1/lr0.1_seed0", "pre_norm_clip1/lr1_seed0",
                       "pre_norm_attn_relax_clip1/lr0.1_seed1",
                       "pre_norm_attn_relax_after_product_clip1/lr0.1_seed0",
                       "post_norm_deepnorm_clip1/lr0.1_seed0",
                       "post_norm_input_norm_clip1/lr1_seed0")),
    ("docs/survival_fp32", ("pre_norm_clip1/lr0.1_seed0",)),
    ("docs/survival_bf16", ("pre_norm_clip1/lr0.1_seed0", "post_norm_deepnorm_clip1/lr0.1_seed0")),
    ("docs/techniques/float16", (
        "qk_norm/lr0.1_seed0", "qk_clip/lr0.1_seed0", "sub_ln/lr0.1_seed0", "ngpt/lr0.1_seed0",
        "fp32_scores/lr0.1_seed0", "mix_ln/lr0.1_seed0", "dyt/lr0.316228_seed1",
        "emb_grad_shrink/lr0.1_seed0", "peri_ln/lr1_seed0")),
)
LADDER_RUNG = ("--config=configs/ladder.py", "--config.model.num_layers=4",
               "--config.model.d_model=32", "--config.model.d_ff=128",
               "--config.model.num_heads=2", "--config.optimizer.learning_rate=0.3")

# Runs normstudy.main from the tree in argv[1], whatever the virtualenv's editable install
# points at (its finder would otherwise import this checkout's package).
_LAUNCH = r"""
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv[1])
sys.argv = ["normstudy.main"] + sys.argv[2:]
runpy.run_module("normstudy.main", run_name="__main__", alter_sys=True)
"""


def cases(steps: int) -> dict:
  short = [f"--config.train.num_steps={steps}", f"--config.train.eval_every={steps}",
           f"--config.train.checkpoint_every={steps}", "--config.train.telemetry_every=50"]
  out = {}
  for directory, names in COMMITTED:
    with open(os.path.join(ROOT, directory, "sweep.json"), encoding="utf-8") as f:
      runs = {r["name"]: r for r in json.load(f)["runs"]}
    for name in names:
      args = shlex.split(runs[name]["command"])[3:]  # after `python -m normstudy.main`
      out[f"{directory}:{name}"] = [a for a in args if not a.startswith("--workdir")] + short
  for dtype in ("float16", "bfloat16"):
    out[f"ladder 4x32 {dtype}"] = [*LADDER_RUNG, f"--config.model.dtype={dtype}", *short]
  out["lm tiny"] = ["--config=configs/lm.py:tiny", "--config.train.num_steps=40",
                    "--config.train.telemetry_every=10"]
  return out


def _records(workdir: str) -> list:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if "per_sec" not in k and "time" not in k}
            for line in f]


def _train_in(tree: str, args: list, workdir: str) -> list:
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
  done = subprocess.run([sys.executable, "-c", _LAUNCH, tree, *args, f"--workdir={workdir}"],
                        cwd=tree, env=env, capture_output=True, text=True, check=False)
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):  # a halt exits 1 with records
    raise RuntimeError(f"{tree}: {' '.join(args)} wrote no records:\n{done.stderr[-3000:]}")
  return _records(workdir)


def first_difference(a: list, b: list) -> str:
  if len(a) != len(b):
    return f"{len(a)} records against {len(b)}"
  for x, y in zip(a, b):
    if x != y:
      keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
      first = keys[0]
      return (f"step {x.get('step')}: {', '.join(keys[:6])} ({first} {x.get(first)} -> "
              f"{y.get(first)})")
  return ""


def bits(argv=None):
  parser = argparse.ArgumentParser(prog="trees.py bits", description=_QUESTIONS["bits"])
  parser.add_argument("--base", default="HEAD~1", help="the commit to compare against")
  parser.add_argument("--steps", type=int, default=120, help="steps of each committed run")
  parser.add_argument("--only", default="", help="only the cases whose name contains this")
  parser.add_argument("--workers", type=int, default=2, help="trainings side by side")
  args = parser.parse_args(argv)
  if args.steps < 1 or args.workers < 1:
    sys.exit(f"error: --steps={args.steps} and --workers={args.workers} must be at least 1")
  rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.base],
                       capture_output=True, text=True, check=False)
  if rev.returncode:
    sys.exit(f"error: --base={args.base} is not a commit of {ROOT}")
  chosen = {k: v for k, v in cases(args.steps).items() if args.only in k}
  if not chosen:
    sys.exit(f"error: --only={args.only} matches no case; cases: {', '.join(cases(args.steps))}")
  with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(os.path.join(tmp, "tree"))
    trees = {"base": export(args.base, os.path.join(tmp, "tree")), "this": ROOT}
    jobs = [(name, side) for name in chosen for side in trees]
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
      futures = {job: pool.submit(_train_in, trees[job[1]], chosen[job[0]],
                                  os.path.join(tmp, "runs", job[1], str(i)))
                 for i, job in enumerate(jobs)}
      differ = 0
      for name in chosen:
        difference = first_difference(futures[name, "base"].result(),
                                      futures[name, "this"].result())
        differ += bool(difference)
        print(f"{'DIFF' if difference else 'SAME'} {name}"
              + (f": {difference}" if difference else ""), flush=True)
  print(f"\nbase = {args.base} ({rev.stdout.strip()}), this = the working tree: "
        f"{len(chosen) - differ} of {len(chosen)} cases the same")
  sys.exit(1 if differ else 0)


# ---- search ------------------------------------------------------------------------------------

def _search(tree: str, workdir: str, rung: tuple, dtype: str, workers: int) -> float:
  """Seconds of one `normstudy.sweep --search` of the ladder rung in `tree` into `workdir`."""
  spec = ladder.LADDER_SEARCH
  argv = [sys.executable, "-m", "normstudy.sweep", "--config=configs/ladder.py",
          f"--search={spec.field}:{spec.low:g},{spec.high:g}",
          f"--rounds={spec.rounds}", f"--probe_decades={spec.probe_decades:g}",
          f"--config.model.dtype={dtype}", f"--workdir={workdir}", f"--workers={workers}",
          *(f"--config.{k}={v}" for k, v in ladder.rung_overrides(*rung).items())]
  started = time.perf_counter()
  subprocess.run(argv, cwd=tree, check=True, capture_output=True,
                 env={**os.environ, "PYTHONPATH": tree})
  return time.perf_counter() - started


def search_rounds(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--base", default="HEAD~1")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--workers", type=int, default=0, help="the sweeps' --workers")
  parser.add_argument("--rung", default="4,32", help="num_layers,d_model")
  parser.add_argument("--dtype", default="float16")
  args = parser.parse_args(argv)
  rung = tuple(int(x) for x in args.rung.split(","))
  with tempfile.TemporaryDirectory() as tmp:
    base_tree = os.path.join(tmp, "base")
    os.makedirs(base_tree)
    trees = {"base": export(args.base, base_tree), "this": ROOT}
    times = {name: [] for name in trees}
    outputs = {}
    for name, tree in trees.items():  # untimed: the programs into the compile cache
      outputs[name] = os.path.join(tmp, f"{name}_warm")
      _search(tree, outputs[name], rung, args.dtype, args.workers)
    for r in range(args.rounds):
      order = list(trees) if r % 2 == 0 else list(trees)[::-1]
      for name in order:
        workdir = os.path.join(tmp, f"{name}_{r}")
        times[name].append(_search(trees[name], workdir, rung, args.dtype, args.workers))
        print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    base, this = (statistics.median(times[n]) for n in ("base", "this"))
    print(f"rung {rung[0]} x {rung[1]} {args.dtype}, --workers={args.workers}, load at the end "
          f"{os.getloadavg()[0]:.1f}: base ({args.base}) {base:.1f} s, this {this:.1f} s, "
          f"speed-up {base / this:.2f}x")
    for table in ("critical_lr.csv", "runs.csv"):
      same = filecmp.cmp(os.path.join(outputs["base"], table),
                         os.path.join(outputs["this"], table), shallow=False)
      print(f"{table}: {'byte-identical' if same else 'DIFFERS'} between the trees")


COMMANDS = {"step": step, "bits": bits, "search": search_rounds}


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv and argv[0] in COMMANDS else "step"
  COMMANDS[command](argv)


if __name__ == "__main__":
  main()

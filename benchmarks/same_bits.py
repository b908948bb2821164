"""Whether a change keeps the committed experiments' bits: committed runs trained in another
commit's tree and in this one, their records compared value for value.

  python benchmarks/same_bits.py [--base HEAD~1] [--steps 120] [--only SUBSTRING] [--workers 2]

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
"""

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile

import ab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (committed sweep directory, its runs): the arms differ in where their norms, relaxations and
# techniques sit; lr 1 halts (the non-finite locate pass runs).
COMMITTED = (
    ("docs/survival", ("pre_norm_clip1/lr0.1_seed0", "pre_norm_clip1/lr1_seed0",
                       "pre_norm_attn_relax_clip1/lr0.1_seed1",
                       "pre_norm_attn_relax_after_product_clip1/lr0.1_seed0",
                       "post_norm_deepnorm_clip1/lr0.1_seed0", "post_norm_input_norm_clip1/lr1_seed0")),
    ("docs/survival_fp32", ("pre_norm_clip1/lr0.1_seed0",)),
    ("docs/survival_bf16", ("pre_norm_clip1/lr0.1_seed0", "post_norm_deepnorm_clip1/lr0.1_seed0")),
    ("docs/techniques/float16", ("qk_norm/lr0.1_seed0", "qk_clip/lr0.1_seed0", "sub_ln/lr0.1_seed0",
                                 "ngpt/lr0.1_seed0", "fp32_scores/lr0.1_seed0", "mix_ln/lr0.1_seed0",
                                 "dyt/lr0.316228_seed1", "emb_grad_shrink/lr0.1_seed0",
                                 "peri_ln/lr1_seed0")),
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


def records(workdir: str) -> list:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if "per_sec" not in k and "time" not in k}
            for line in f]


def train(tree: str, args: list, workdir: str) -> list:
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
  done = subprocess.run([sys.executable, "-c", _LAUNCH, tree, *args, f"--workdir={workdir}"],
                        cwd=tree, env=env, capture_output=True, text=True, check=False)
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):  # a halt exits 1 with records
    raise RuntimeError(f"{tree}: {' '.join(args)} wrote no records:\n{done.stderr[-3000:]}")
  return records(workdir)


def first_difference(a: list, b: list) -> str:
  if len(a) != len(b):
    return f"{len(a)} records against {len(b)}"
  for x, y in zip(a, b):
    if x != y:
      keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
      return f"step {x.get('step')}: {', '.join(keys[:6])} ({keys[0]} {x.get(keys[0])} -> {y.get(keys[0])})"
  return ""


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    trees = {"base": ab.export(args.base, os.path.join(tmp, "tree")), "this": ROOT}
    jobs = [(name, side) for name in chosen for side in trees]
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
      futures = {job: pool.submit(train, trees[job[1]], chosen[job[0]],
                                  os.path.join(tmp, "runs", job[1], str(i)))
                 for i, job in enumerate(jobs)}
      differ = 0
      for name in chosen:
        difference = first_difference(futures[name, "base"].result(),
                                      futures[name, "this"].result())
        differ += bool(difference)
        print(f"{'DIFF' if difference else 'SAME'} {name}" + (f": {difference}" if difference else ""),
              flush=True)
  print(f"\nbase = {args.base} ({rev.stdout.strip()}), this = the working tree: "
        f"{len(chosen) - differ} of {len(chosen)} cases the same")
  sys.exit(1 if differ else 0)


if __name__ == "__main__":
  main()

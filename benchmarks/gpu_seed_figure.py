"""The seed figure at MERT's size on one GPU, within one lease (`make gpu-seed-figure`).

  python benchmarks/gpu_seed_figure.py [--dry-run] [--budget_minutes 9] [--steps N]
      [--workdir runs/gpu_seed_figure] [--results docs/gpu/results.json] [--gpu_memory_gib 79.6]

The seed figure's four arms (configs/seed_figure.py: Pre-Norm clip 10 and clip 1, DeepNorm clip 1,
attention relax clip 1) at MERT's encoder size: 24 layers, width 1024, 16 heads of 64, MLP 4096,
512 tokens a row, float16, batch 16 rows (docs/gpu/results.json's paper-size rows), MERT's peak
learning rate 1.5e-3 with the recipe's warm-up share (8%), one seed, as many steps as the lease
holds: `normstudy.study`, then its figure of loss and loss scale against step.

Before anything trains it prints the steps, each program's memory plan against the GPU
(normstudy.engine.memory; XLA given MEM_FRACTION of it), the time (every compile counted and each
arm's measured step time, docs/gpu/results.json) and the disk (records only: no checkpoint is
written, train.checkpoint_every=-1, so a killed lease starts over), and refuses in one line when
the memory or the time does not fit. The outputs append to docs/gpu/seed_figure/<UTC time>_<GPU>/.
--dry-run prints the plan and stops (no GPU needed).
"""

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_ladder  # noqa: E402  (the lease's memory and compile accounting)
from configs import seed_figure  # noqa: E402
from normstudy.core import per_run  # noqa: E402
from normstudy.engine import memory  # noqa: E402

MERT_SIZE = {"model.num_layers": 24, "model.d_model": 1024, "model.num_heads": 16,
             "model.d_ff": 4096, "model.max_len": 512, "model.dtype": "float16",
             "train.batch_size": 16}
LEARNING_RATE = 1.5e-3  # MERT-330M's peak
WARMUP_SHARE = 0.08  # the recipe's 80 of 1000 steps
# Outside the steps: starting the study's process (imports, data), its analysis and figure.
OVERHEAD_SECONDS = gpu_ladder.PROCESS_SECONDS + 30.0
RECORD_BYTES_PER_STEP = 600  # a metrics.jsonl line and its TensorBoard event, per run


def arm_config(arm: str, steps: int):
  config = seed_figure.get_config(arm)
  for field, value in fields(steps).items():
    section, name = field.split(".")
    config[section][name] = value
  return config


def fields(steps: int) -> dict:
  """Every field the lease sets beside the arms' own."""
  return {**MERT_SIZE, "optimizer.learning_rate": LEARNING_RATE,
          "optimizer.warmup_steps": max(1, round(WARMUP_SHARE * steps)),
          "train.num_steps": steps, "train.eval_every": max(1, steps // 5),
          "train.log_every": 1, "train.telemetry_every": 0, "train.checkpoint_every": -1}


def programs(steps: int = 100) -> list:
  """[(arms, runs)] as normstudy.study groups them: arms whose configs differ only in per-run
  fields (the two Pre-Norm clips) share one compiled program (normstudy.core.per_run's key)."""
  groups = {}
  for arm in seed_figure.EXPERIMENT.study_arms:
    groups.setdefault(per_run.program_key(arm_config(arm, steps)), []).append(arm)
  return [(tuple(arms), len(arms)) for arms in groups.values()]


def lease_plan(measured: dict, budget_s: float, usable_bytes: float, steps: int = 0) -> dict:
  """{"steps", "seconds", "compile_s", "memory" [(arms, plan)], "disk", "ms_per_step"}: the
  most steps (a multiple of 10) the budget holds after the process, its analysis and every
  compile, each arm stepping at its measured time; or `steps` when given. SystemExit (one line)
  when a program's plan exceeds `usable_bytes` or no step fits the budget (gpu_ladder.Refused)."""
  paper = measured["paper_size_fp16"]
  step_s = sum(paper[arm]["ms_per_step"] for arm in seed_figure.EXPERIMENT.study_arms) / 1e3
  compile_s = len(programs()) * gpu_ladder.COMPILES_PER_PROGRAM * gpu_ladder.compile_seconds(
      measured)
  if not steps:
    steps = int((budget_s - OVERHEAD_SECONDS - compile_s) / step_s) // 10 * 10
    if steps < 10:
      raise gpu_ladder.Refused(f"--budget_minutes={budget_s / 60:g} leaves no time to train "
                               f"after {OVERHEAD_SECONDS + compile_s:.0f} s of start-up and "
                               "compiles")
  one_gpu = {"runs": 1, "data": 1, "fsdp": 1, "tensor": 1}
  planned = [(arms, memory.plan(arm_config(arms[0], steps), one_gpu, num_runs=runs,
                                platform="gpu")) for arms, runs in programs()]
  for arms, needed in planned:
    if needed.total > usable_bytes:
      raise gpu_ladder.Refused(f"{' and '.join(arms)} at MERT's size plans "
                               f"{memory.human(needed.total)}, more than the "
                               f"{memory.human(usable_bytes)} the GPU gives XLA")
  seconds = OVERHEAD_SECONDS + compile_s + steps * step_s
  disk = steps * RECORD_BYTES_PER_STEP * len(seed_figure.EXPERIMENT.study_arms)
  return {"steps": steps, "seconds": seconds, "compile_s": compile_s, "memory": planned,
          "disk": disk, "ms_per_step": 1e3 * step_s}


def describe(plan: dict, measured: dict, usable_bytes: float, budget_s: float) -> list:
  lines = [f"seed figure at MERT's size (24 x 1024, 16 heads, length 512, float16, batch 16, "
           f"lr {LEARNING_RATE:g}): {plan['steps']} steps an arm, 4 arms in "
           f"{len(plan['memory'])} programs"]
  for arms, needed in plan["memory"]:
    lines.append(f"  {' + '.join(arms)}: memory plan {needed.describe()}")
  lines.append(f"time: about {plan['seconds'] / 60:.1f} min of a {budget_s / 60:g}-min budget "
               f"({plan['compile_s']:.0f} s compiling, {plan['ms_per_step']:.0f} ms for a step of "
               f"all four arms, measured on a {measured['device']}); memory within "
               f"{memory.human(usable_bytes)} ({gpu_ladder.MEM_FRACTION:g} of the GPU); disk "
               f"{plan['disk'] / 2**20:.1f} MiB (records; no checkpoints)")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dry-run", action="store_true")
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "gpu_seed_figure"))
  parser.add_argument("--budget_minutes", type=float, default=9.0,
                      help="the training's share of a 10-minute lease")
  parser.add_argument("--steps", type=int, default=0, help="steps an arm (default: what fits)")
  parser.add_argument("--results", default=os.path.join(ROOT, "docs", "gpu", "results.json"))
  parser.add_argument("--gpu_memory_gib", type=float, default=gpu_ladder.H100_MEMORY_GIB,
                      help="the GPU's memory (default: an 80 GB H100's)")
  args = parser.parse_args()
  if args.steps < 0 or args.budget_minutes <= 0:
    print(f"error: --steps={args.steps} and --budget_minutes={args.budget_minutes:g}: steps >= 0 "
          "(0: what fits) and a budget > 0", file=sys.stderr)
    return 2
  measured = gpu_ladder.read_results(args.results)
  if measured is None:
    return 2
  usable = args.gpu_memory_gib * gpu_ladder.MEM_FRACTION * memory.GIB
  budget = args.budget_minutes * 60
  try:
    plan = lease_plan(measured, budget, usable, args.steps)
  except gpu_ladder.Refused as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("\n".join(describe(plan, measured, usable, budget)), flush=True)
  if plan["seconds"] > budget:
    print(f"error: the estimate, {plan['seconds'] / 60:.1f} min, exceeds --budget_minutes="
          f"{args.budget_minutes:g}", file=sys.stderr)
    return 2
  if args.dry_run:
    return 0
  env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=f"{gpu_ladder.MEM_FRACTION}",
             XLA_CLIENT_MEM_FRACTION=f"{gpu_ladder.MEM_FRACTION}")
  command = [sys.executable, "-m", "normstudy.study", "--config=configs/seed_figure.py",
             f"--workdir={args.workdir}", "--seeds=0",
             *(f"--config.{k}={v}" for k, v in fields(plan["steps"]).items())]
  done = subprocess.run(command, cwd=ROOT, env=env).returncode
  if done != 0:
    print(f"error: the study stopped with exit code {done}; the same command resumes it",
          file=sys.stderr)
    return done
  out = gpu_ladder.output_directory("seed_figure")
  os.makedirs(out, exist_ok=True)
  for name in sorted(os.listdir(args.workdir)):
    source = os.path.join(args.workdir, name)
    if os.path.isfile(source) and name.endswith((".png", ".svg", ".csv", ".md", ".json")):
      shutil.copy(source, os.path.join(out, name))
  print(f"outputs: {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""What fits one lease of one GPU, planned before it starts: the ladder's next rungs and the seed
figure at MERT's size (each --dry-run prints its plan without a GPU).

  python benchmarks/lease.py [ladder] [--dry-run] [--workdir runs/gpu_ladder] [--keep-checkpoints]
      [--budget_minutes 10] [--results docs/gpu/results.json]      (bash benchmarks/gpu_ladder.sh)
  python benchmarks/lease.py seed-figure [--dry-run] [--budget_minutes 9] [--steps N]
      [--workdir runs/gpu_seed_figure] [--results docs/gpu/results.json] [--gpu_memory_gib 79.6]
                                                                      (make gpu-seed-figure)

ladder: The ladder's next width rungs on one GPU, within one lease (benchmarks/gpu_ladder.sh).

The plan (configs/ladder_gpu.py's LEASE_*): plain Pre-LN and DeepNorm in float16, the CPU ladder's
instrument (120-step runs of the survival recipe on Shakespeare as bytes), at 4 x 256, 4 x 512,
4 x 1024 (heads 16 wide, as the CPU ladder's) and 24 x 1024 with MERT's 16 heads of 64. Each
(arm, rung) is ONE program: its learning-rate grid x seeds vmapped (`normstudy.sweep --axis`),
so a rung compiles once per arm; its critical rate is the logistic fit of the sweep's analysis
(survival.csv). Each run checkpoints only its last state, and a program's checkpoints are deleted
after its analysis unless --keep-checkpoints: the disk it needs is the largest program's.

Before anything trains it prints the programs, the estimated time of each (from a measured GPU
run, docs/gpu/results.json: the seed figure's arms at 24 x 1024 give the achieved FLOP/s and,
with the section's wall time, the compile time; the K = 64 sweep gives the per-step floor of a
small vmapped program) and the disk it needs, and refuses in one line when the disk has less or
the estimate exceeds --budget_minutes. The outputs append to docs/gpu/ladder/<UTC time>_<GPU>/
(no earlier run overwritten). --dry-run prints the plan and stops (no GPU needed).

seed-figure: The seed figure at MERT's size on one GPU, within one lease (`make gpu-seed-figure`).

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
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import ladder_gpu  # noqa: E402
from configs import seed_figure  # noqa: E402
from normstudy.core import per_run  # noqa: E402
from normstudy.engine import memory  # noqa: E402

# Each subcommand's question (its --help): the first line of its part of the docstring.
_QUESTIONS = {name: re.search(rf"^{name}: (.*)$", __doc__, re.M).group(1)
              for name in ("ladder", "seed-figure")}



# ---- ladder ------------------------------------------------------------------------------------

# Per run: float32 parameters and Adam's two moments (the checkpoint's bulk), and orbax's files.
CHECKPOINT_BYTES_PER_PARAMETER = 12
CHECKPOINT_OVERHEAD = 1.1
PROCESS_SECONDS = 25.0  # a sweep process: imports, data, the analysis (measured on CPU: 20-30 s)
# An 80 GB H100's memory as CUDA reports it (81,559 MiB), and the share XLA may take of it: the
# sweeps run with XLA_PYTHON_CLIENT_MEM_FRACTION (and its new name XLA_CLIENT_MEM_FRACTION) at
# MEM_FRACTION instead of JAX's default 0.75.
H100_MEMORY_GIB = 81559 / 1024
MEM_FRACTION = 0.9
# The programs a run compiles (normstudy.engine.train), in units of the measured compile time of
# one train step (docs/gpu/results.json): the block of train steps and the one-step program (the
# steps that do not fill a block go alone) at 1 each; the evaluation and the state's
# initialisation, forward passes only, at 1/3 each.
COMPILES_PER_PROGRAM = 1 + 1 + 1 / 3 + 1 / 3


@dataclasses.dataclass(frozen=True)
class Program:
  arm: str
  num_layers: int
  d_model: int
  num_heads: int
  learning_rates: tuple
  seeds: tuple
  max_runs: int = 0  # runs a compiled program holds (0: all; normstudy.sweep's flag)

  @property
  def runs(self) -> int:
    return len(self.learning_rates) * len(self.seeds)

  @property
  def parts(self) -> int:
    """The compiled programs the sweep splits its runs into."""
    return -(-self.runs // self.max_runs) if self.max_runs else 1

  @property
  def runs_per_part(self) -> int:
    return -(-self.runs // self.parts)

  @property
  def directory(self) -> str:
    return os.path.join("float16", f"L{self.num_layers}_d{self.d_model}", self.arm)

  def config(self):
    config = ladder_gpu.get_config(self.arm)
    config.model.update(num_layers=self.num_layers, d_model=self.d_model,
                        d_ff=4 * self.d_model, num_heads=self.num_heads, dtype="float16")
    config.train.num_steps = ladder_gpu.LEASE_STEPS
    return config

  def parameters(self) -> int:
    return memory.parameter_count(types.SimpleNamespace(**dict(self.config().model)))

  def checkpoint_bytes(self, keep: bool) -> float:
    """The last states it writes: none unless they are kept (train.checkpoint_every=-1)."""
    return (self.parameters() * CHECKPOINT_BYTES_PER_PARAMETER * self.runs * CHECKPOINT_OVERHEAD
            if keep else 0.0)

  def memory(self):
    """The program's memory plan on one GPU (normstudy.engine.memory: every run's state and
    step live at once, vmapped)."""
    return memory.plan(self.config(), {"runs": 1, "data": 1, "fsdp": 1, "tensor": 1},
                       num_runs=self.runs_per_part, platform="gpu")

  def argv(self, workdir: str, keep: bool = False) -> list:
    fields = {"model.num_layers": self.num_layers, "model.d_model": self.d_model,
              "model.d_ff": 4 * self.d_model, "model.num_heads": self.num_heads,
              "model.dtype": "float16", "train.checkpoint_every": 0 if keep else -1}
    return ["-m", "normstudy.sweep", f"--config=configs/ladder_gpu.py:{self.arm}",
            f"--workdir={os.path.join(workdir, self.directory)}",
            "--axis=optimizer.learning_rate=" + ",".join(f"{lr:g}" for lr in self.learning_rates),
            "--axis=train.seed=" + ",".join(str(s) for s in self.seeds),
            *(f"--config.{k}={v}" for k, v in fields.items()),
            *([f"--max_runs_per_program={self.max_runs}"] if self.max_runs else [])]


class Refused(Exception):
  """A lease that does not fit: its line, printed as `error: ...` with exit status 2."""


def plan(usable_bytes: float = H100_MEMORY_GIB * MEM_FRACTION * memory.GIB) -> list:
  """The sweeps: per rung and arm its learning-rate grid x seeds, as few compiled programs
  (normstudy.sweep --max_runs_per_program) as keep each one's memory plan within `usable_bytes`.
  Refused naming the rung when even one run does not fit."""
  out = []
  for num_layers, d_model, num_heads, seeds in ladder_gpu.LEASE_RUNGS:
    for arm in ladder_gpu.LEASE_ARMS:
      whole = Program(arm, num_layers, d_model, num_heads,
                      tuple(ladder_gpu.LEASE_LEARNING_RATES), tuple(seeds))
      for parts in range(1, whole.runs + 1):
        program = dataclasses.replace(whole, max_runs=-(-whole.runs // parts))
        if program.memory().total <= usable_bytes:
          break
      else:
        raise Refused(f"{arm} at {num_layers} x {d_model}: one run plans "
                      f"{memory.human(program.memory().total)}, more than the "
                      f"{memory.human(usable_bytes)} the GPU gives XLA")
      out.append(program)
  return out


def compile_seconds(measured: dict) -> float:
  """One train step's compile at MERT's size, from docs/gpu/results.json: the paper-size
  section's wall time less its measured steps (each arm's timed steps and one warm-up), per
  arm."""
  paper = measured["paper_size_fp16"]
  ms = sum(r["ms_per_step"] for r in paper.values()) / len(paper)
  steps_measured = measured.get("steps", 20)
  return max(0.0, (measured["section_seconds"]["paper_size_fp16"]
                   - len(paper) * (steps_measured + 1) * ms / 1e3) / len(paper))


def estimate_seconds(program: Program, measured: dict) -> float:
  """Compile, plus steps x max(the FLOP-bound time at the measured rate, the measured per-step
  floor of a vmapped program), plus the process: from docs/gpu/results.json."""
  paper = measured["paper_size_fp16"]
  achieved = sum(r["model_flops_per_s"] for r in paper.values()) / len(paper)
  compile_s = compile_seconds(measured)
  floor = max(r["vmapped_ms_per_step"] for r in measured["sweep"]) / 1e3
  flops = memory.train_flops(program.config()) * program.runs_per_part
  step = max(flops / achieved, floor)
  return (program.parts * (COMPILES_PER_PROGRAM * compile_s + ladder_gpu.LEASE_STEPS * step)
          + PROCESS_SECONDS)


def describe(programs, measured, source, keep: bool = False,
             usable_bytes: float = H100_MEMORY_GIB * MEM_FRACTION * memory.GIB) -> tuple:
  total, lines = 0.0, []
  for p in programs:
    seconds = estimate_seconds(p, measured)
    total += seconds
    lines.append(f"  {p.arm} at {p.num_layers} x {p.d_model} ({p.num_heads} heads, "
                 f"{p.parameters() / 1e6:.1f}M parameters): {p.runs} runs "
                 f"({len(p.learning_rates)} rates x {len(p.seeds)} seeds) in "
                 + ("one program" if p.parts == 1 else f"{p.parts} programs of {p.runs_per_part}")
                 + f", about {seconds:.0f} s, memory plan {memory.human(p.memory().total)}"
                 + (f", last states {p.checkpoint_bytes(keep) / 2**30:.1f} GiB" if keep else ""))
  disk = max(p.checkpoint_bytes(keep) for p in programs)
  lines.insert(0, f"gpu ladder: {sum(p.parts for p in programs)} programs, float16, "
                  f"{ladder_gpu.LEASE_STEPS} steps a run (times estimated from {source}, "
                  f"measured on a {measured['device']}: "
                  f"{COMPILES_PER_PROGRAM:.2g} compiles of a train step a program)")
  lines.append(f"estimated total: {total / 60:.1f} min; every program's memory plan within "
               f"{memory.human(usable_bytes)} ({MEM_FRACTION:g} of an 80 GB H100's "
               f"{H100_MEMORY_GIB:.1f} GiB); disk needed: {disk / 2**30:.1f} GiB "
               + ("(the largest program's last states, deleted after its analysis)" if keep
                  else "(no checkpoints: train.checkpoint_every=-1; --keep-checkpoints keeps "
                  "them)"))
  return lines, total, disk


def read_results(path: str) -> dict | None:
  """benchmarks/gpu.sh's results.json, or None after one line saying why it cannot be read."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    print(f"error: --results={path}: {e}; it is benchmarks/gpu.sh's results.json",
          file=sys.stderr)
    return None


def output_directory(kind: str) -> str:
  """docs/gpu/<kind>/<UTC time>_<GPU>: a lease's outputs, the device named, none overwritten."""
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
  named = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.splitlines()
  device = "".join(c if c.isalnum() else "-" for c in (named[0] if named else "gpu"))
  return os.path.join(ROOT, "docs", "gpu", kind, f"{stamp}_{device}")


def ladder(argv=None):
  parser = argparse.ArgumentParser(prog="lease.py ladder", description=_QUESTIONS["ladder"])
  parser.add_argument("--dry-run", action="store_true")
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "gpu_ladder"))
  parser.add_argument("--keep-checkpoints", action="store_true")
  parser.add_argument("--budget_minutes", type=float, default=10.0)
  parser.add_argument("--results", default=os.path.join(ROOT, "docs", "gpu", "results.json"))
  parser.add_argument("--gpu_memory_gib", type=float, default=H100_MEMORY_GIB,
                      help="the GPU's memory (default: an 80 GB H100's)")
  args = parser.parse_args(argv)
  measured = read_results(args.results)
  if measured is None:
    return 2
  usable = args.gpu_memory_gib * MEM_FRACTION * memory.GIB
  try:
    programs = plan(usable)
  except Refused as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  lines, total, disk = describe(programs, measured, os.path.relpath(args.results, ROOT),
                                args.keep_checkpoints, usable)
  print("\n".join(lines), flush=True)
  if total > args.budget_minutes * 60:
    print(f"error: the estimate, {total / 60:.1f} min, exceeds --budget_minutes="
          f"{args.budget_minutes:g}", file=sys.stderr)
    return 2
  where = os.path.abspath(args.workdir)
  while not os.path.exists(where):  # the nearest directory that exists: the disk it will use
    where = os.path.dirname(where)
  free = shutil.disk_usage(where).free
  short = free < disk
  if args.dry_run:
    print(f"this machine's disk ({where}): {free / 2**30:.1f} GiB free: "
          + ("too little; the run would be refused here" if short else "enough"))
    return 0
  if short:
    print(f"error: {where} has {free / 2**30:.1f} GiB free and the ladder needs "
          f"{disk / 2**30:.1f} GiB", file=sys.stderr)
    return 2
  os.makedirs(args.workdir, exist_ok=True)
  start = time.monotonic()
  for i, p in enumerate(programs, start=1):
    print(f"[gpu ladder] {i}/{len(programs)}: {p.arm} at {p.num_layers} x {p.d_model}",
          flush=True)
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=f"{MEM_FRACTION}",
               XLA_CLIENT_MEM_FRACTION=f"{MEM_FRACTION}")
    done = subprocess.run([sys.executable, *p.argv(args.workdir, args.keep_checkpoints)],
                          cwd=ROOT, env=env).returncode
    if done != 0:
      print(f"error: {p.directory} stopped with exit code {done}; re-running resumes it",
            file=sys.stderr)
      return done
    spent = time.monotonic() - start
    print(f"[gpu ladder] {i}/{len(programs)} done | {spent:.0f}s | ETA "
          f"{spent / i * (len(programs) - i):.0f}s", flush=True)
  out = output_directory("ladder")
  for p in programs:
    for name in ("survival.csv", "summary.csv", "sweep.json"):
      source = os.path.join(args.workdir, p.directory, name)
      if os.path.exists(source):
        os.makedirs(os.path.join(out, p.directory), exist_ok=True)
        shutil.copy(source, os.path.join(out, p.directory, name))
  print(f"outputs: {out}")
  return 0


# ---- seed-figure -------------------------------------------------------------------------------

MERT_SIZE = {"model.num_layers": 24, "model.d_model": 1024, "model.num_heads": 16,
             "model.d_ff": 4096, "model.max_len": 512, "model.dtype": "float16",
             "train.batch_size": 16}
LEARNING_RATE = 1.5e-3  # MERT-330M's peak
WARMUP_SHARE = 0.08  # the recipe's 80 of 1000 steps
# Outside the steps: starting the study's process (imports, data), its analysis and figure.
OVERHEAD_SECONDS = PROCESS_SECONDS + 30.0
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
  when a program's plan exceeds `usable_bytes` or no step fits the budget (Refused)."""
  paper = measured["paper_size_fp16"]
  step_s = sum(paper[arm]["ms_per_step"] for arm in seed_figure.EXPERIMENT.study_arms) / 1e3
  compile_s = len(programs()) * COMPILES_PER_PROGRAM * compile_seconds(
      measured)
  if not steps:
    steps = int((budget_s - OVERHEAD_SECONDS - compile_s) / step_s) // 10 * 10
    if steps < 10:
      raise Refused(f"--budget_minutes={budget_s / 60:g} leaves no time to train "
                               f"after {OVERHEAD_SECONDS + compile_s:.0f} s of start-up and "
                               "compiles")
  one_gpu = {"runs": 1, "data": 1, "fsdp": 1, "tensor": 1}
  planned = [(arms, memory.plan(arm_config(arms[0], steps), one_gpu, num_runs=runs,
                                platform="gpu")) for arms, runs in programs()]
  for arms, needed in planned:
    if needed.total > usable_bytes:
      raise Refused(f"{' and '.join(arms)} at MERT's size plans "
                               f"{memory.human(needed.total)}, more than the "
                               f"{memory.human(usable_bytes)} the GPU gives XLA")
  seconds = OVERHEAD_SECONDS + compile_s + steps * step_s
  disk = steps * RECORD_BYTES_PER_STEP * len(seed_figure.EXPERIMENT.study_arms)
  return {"steps": steps, "seconds": seconds, "compile_s": compile_s, "memory": planned,
          "disk": disk, "ms_per_step": 1e3 * step_s}


def describe_seed_figure(plan: dict, measured: dict, usable_bytes: float, budget_s: float) -> list:
  lines = [f"seed figure at MERT's size (24 x 1024, 16 heads, length 512, float16, batch 16, "
           f"lr {LEARNING_RATE:g}): {plan['steps']} steps an arm, 4 arms in "
           f"{len(plan['memory'])} programs"]
  for arms, needed in plan["memory"]:
    lines.append(f"  {' + '.join(arms)}: memory plan {needed.describe()}")
  lines.append(f"time: about {plan['seconds'] / 60:.1f} min of a {budget_s / 60:g}-min budget "
               f"({plan['compile_s']:.0f} s compiling, {plan['ms_per_step']:.0f} ms for a step of "
               f"all four arms, measured on a {measured['device']}); memory within "
               f"{memory.human(usable_bytes)} ({MEM_FRACTION:g} of the GPU); disk "
               f"{plan['disk'] / 2**20:.1f} MiB (records; no checkpoints)")
  return lines


def seed_figure_lease(argv=None):
  parser = argparse.ArgumentParser(prog="lease.py seed-figure",
                                   description=_QUESTIONS["seed-figure"])
  parser.add_argument("--dry-run", action="store_true")
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "gpu_seed_figure"))
  parser.add_argument("--budget_minutes", type=float, default=9.0,
                      help="the training's share of a 10-minute lease")
  parser.add_argument("--steps", type=int, default=0, help="steps an arm (default: what fits)")
  parser.add_argument("--results", default=os.path.join(ROOT, "docs", "gpu", "results.json"))
  parser.add_argument("--gpu_memory_gib", type=float, default=H100_MEMORY_GIB,
                      help="the GPU's memory (default: an 80 GB H100's)")
  args = parser.parse_args(argv)
  if args.steps < 0 or args.budget_minutes <= 0:
    print(f"error: --steps={args.steps} and --budget_minutes={args.budget_minutes:g}: steps >= 0 "
          "(0: what fits) and a budget > 0", file=sys.stderr)
    return 2
  measured = read_results(args.results)
  if measured is None:
    return 2
  usable = args.gpu_memory_gib * MEM_FRACTION * memory.GIB
  budget = args.budget_minutes * 60
  try:
    plan = lease_plan(measured, budget, usable, args.steps)
  except Refused as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("\n".join(describe_seed_figure(plan, measured, usable, budget)), flush=True)
  if plan["seconds"] > budget:
    print(f"error: the estimate, {plan['seconds'] / 60:.1f} min, exceeds --budget_minutes="
          f"{args.budget_minutes:g}", file=sys.stderr)
    return 2
  if args.dry_run:
    return 0
  env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=f"{MEM_FRACTION}",
             XLA_CLIENT_MEM_FRACTION=f"{MEM_FRACTION}")
  command = [sys.executable, "-m", "normstudy.study", "--config=configs/seed_figure.py",
             f"--workdir={args.workdir}", "--seeds=0",
             *(f"--config.{k}={v}" for k, v in fields(plan["steps"]).items())]
  done = subprocess.run(command, cwd=ROOT, env=env).returncode
  if done != 0:
    print(f"error: the study stopped with exit code {done}; the same command resumes it",
          file=sys.stderr)
    return done
  out = output_directory("seed_figure")
  os.makedirs(out, exist_ok=True)
  for name in sorted(os.listdir(args.workdir)):
    source = os.path.join(args.workdir, name)
    if os.path.isfile(source) and name.endswith((".png", ".svg", ".csv", ".md", ".json")):
      shutil.copy(source, os.path.join(out, name))
  print(f"outputs: {out}")
  return 0


COMMANDS = {"ladder": ladder, "seed-figure": seed_figure_lease}


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv and argv[0] in COMMANDS else "ladder"
  return COMMANDS[command](argv)


if __name__ == "__main__":
  sys.exit(main())

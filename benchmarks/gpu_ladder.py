"""The ladder's next width rungs on one GPU, within one lease (`bash benchmarks/gpu_ladder.sh`).

  python benchmarks/gpu_ladder.py [--dry-run] [--workdir runs/gpu_ladder] [--keep-checkpoints]
      [--budget_minutes 10] [--results docs/gpu/results.json]

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
"""

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import ladder_gpu  # noqa: E402
from normstudy.engine import memory  # noqa: E402

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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dry-run", action="store_true")
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "gpu_ladder"))
  parser.add_argument("--keep-checkpoints", action="store_true")
  parser.add_argument("--budget_minutes", type=float, default=10.0)
  parser.add_argument("--results", default=os.path.join(ROOT, "docs", "gpu", "results.json"))
  parser.add_argument("--gpu_memory_gib", type=float, default=H100_MEMORY_GIB,
                      help="the GPU's memory (default: an 80 GB H100's)")
  args = parser.parse_args()
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


if __name__ == "__main__":
  sys.exit(main())

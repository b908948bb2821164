"""normstudy's training step against the peers' (../shared/peer: PyTorch eager, nanodo) at the
sizes S and M, in one sitting: each round runs every contender once per size, each in a fresh
process, in alternating order (the machine's speed drifts; alternation spreads the drift over
every side).

  python benchmarks/peers.py --torch_python PATH [--nanodo_root DIR] [--sizes S,M]
                             [--rounds 3] [--steps 25] [--json out.json]

`--torch_python`: a Python with torch and numpy (../shared/peer/README.md: `python3 -m venv
.peer-venv && .peer-venv/bin/pip install torch numpy`, outside the repo). `--nanodo_root`: an
export of nanodo's repository (optional: without it nanodo is not timed).

All sides time the same model (benchmarks/throughput.py's SIZES: float32 decoder, Adam(W),
clip 1.0) the same way (../shared/peer/cpumon.py): per-call times, counting only calls during
which other processes used less than 0.15 of a core, the median of each window of 25 such
steps. normstudy is timed as `normstudy.main` trains: blocks of train.steps_per_dispatch (16)
steps in one compiled loop, each block's batches staged from the host and its metrics fetched
back (one block is one timed call, its time spread evenly over its steps), and, for
reference, one step per dispatch. Printed: each round's tokens/s, then the median over rounds
of each contender, normstudy's ratio to each peer (of those medians, and each round's ratio
with their median: a round's contenders ran minutes apart, so its ratio is the paired one), and
the machine's load when the sitting started and ended; --json writes every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(os.path.dirname(ROOT), "shared", "peer")
WINDOWS, CLEAN_THRESHOLD = 2, 0.15


def _result_line(output: str) -> dict:
  lines = [l for l in output.splitlines() if l.startswith("RESULT ")]
  if not lines:
    raise RuntimeError(f"no RESULT line in:\n{output[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def _tokens_per_s(result: dict) -> float:
  return statistics.median(w["tokens_per_s"] for w in result["windows"])


def run_peer(name: str, python: str, size: str, steps: int, nanodo_root: str | None) -> float:
  script = {"torch": "bench_torch.py", "nanodo": "bench_nanodo.py"}[name]
  env = dict(os.environ)
  if name == "nanodo":
    env["NANODO_ROOT"] = nanodo_root
  done = subprocess.run([python, os.path.join(PEER, script), "--config", size,
                         "--steps", str(steps), "--windows", str(WINDOWS)],
                        cwd=PEER, env=env, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"{script} --config {size} exited {done.returncode}:\n"
                       f"{done.stderr[-3000:]}")
  return _tokens_per_s(_result_line(done.stdout))


def run_normstudy(size: str, steps: int) -> dict:
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "--_normstudy", size,
                         "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True,
                        check=False)
  if done.returncode != 0:
    raise RuntimeError(f"normstudy at {size} exited {done.returncode}:\n{done.stderr[-3000:]}")
  return _result_line(done.stdout)


def time_normstudy(size: str, steps: int) -> dict:
  """The child process: normstudy's engine at `size`, in blocks and one step per dispatch."""
  sys.path[:0] = [PEER, os.path.join(ROOT, "benchmarks"), ROOT]
  import cpumon  # pylint: disable=import-outside-toplevel
  import throughput  # pylint: disable=import-outside-toplevel

  config = throughput.size_config(size)
  engine, m = throughput.EngineSteps(config), config.model
  length = engine.length
  tokens = config.train.batch_size * m.max_len
  result = {"size": size, "steps_per_dispatch": length}
  for name, fn, per_call in (("blocks", engine.block, length), ("one_step", engine.one_step, 1)):
    fn()  # compiles
    calls = max(2, -(-steps // per_call))
    windows = []
    for _ in range(WINDOWS):
      loop = cpumon.timed_loop(fn, calls, 10 * calls, CLEAN_THRESHOLD)
      seconds = (loop["median_clean_s"] or loop["median_all_s"]) / per_call
      windows.append({"tokens_per_s": tokens / seconds, "clean_calls": loop["n_clean"],
                      "calls": loop["n_total"]})
    result[name] = {"windows": windows}
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--torch_python", default=None, help="a Python with torch (required)")
  parser.add_argument("--nanodo_root", default=None, help="nanodo's export (optional)")
  parser.add_argument("--sizes", default="S,M")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=25, help="clean steps per window")
  parser.add_argument("--json", default=None)
  parser.add_argument("--_normstudy", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._normstudy:
    print("RESULT " + json.dumps(time_normstudy(args._normstudy, args.steps)), flush=True)
    return
  sizes = args.sizes.split(",")
  problems = [f"--sizes {s!r} (allowed: S, M)" for s in sizes if s not in ("S", "M")]
  if args.rounds < 1 or args.steps < 2:
    problems.append(f"--rounds {args.rounds} / --steps {args.steps} (at least 1 / 2)")
  if not args.torch_python or not os.access(args.torch_python, os.X_OK):
    problems.append(f"--torch_python {args.torch_python!r} (a Python with torch: "
                    "../shared/peer/README.md)")
  if args.nanodo_root and not os.path.isdir(args.nanodo_root):
    problems.append(f"--nanodo_root {args.nanodo_root!r} (a directory)")
  if problems:
    sys.exit("error: " + "; ".join(problems))
  contenders = ["torch", "normstudy"] + (["nanodo"] if args.nanodo_root else [])
  load_start = os.getloadavg()
  print(f"load at the start: {load_start[0]:.2f} (1 min), {load_start[1]:.2f} (5 min); "
        f"{os.cpu_count()} CPUs", flush=True)
  figures = {size: {c: [] for c in contenders + ["normstudy_one_step"]} for size in sizes}
  for round_index in range(args.rounds):
    order = contenders if round_index % 2 == 0 else contenders[::-1]
    for size in sizes:
      for contender in order:
        if contender == "normstudy":
          result = run_normstudy(size, args.steps)
          figures[size]["normstudy"].append(_tokens_per_s(result["blocks"]))
          figures[size]["normstudy_one_step"].append(_tokens_per_s(result["one_step"]))
          shown = (f"{figures[size]['normstudy'][-1]:.0f} tokens/s in blocks, "
                   f"{figures[size]['normstudy_one_step'][-1]:.0f} one step per dispatch")
        else:
          python = args.torch_python if contender == "torch" else sys.executable
          figures[size][contender].append(
              run_peer(contender, python, size, args.steps, args.nanodo_root))
          shown = f"{figures[size][contender][-1]:.0f} tokens/s"
        print(f"round {round_index + 1}/{args.rounds} {size} {contender}: {shown}", flush=True)
  load_end = os.getloadavg()
  print(f"\nload at the end: {load_end[0]:.2f} (1 min), {load_end[1]:.2f} (5 min)")
  print(f"\nmedian tokens/s over {args.rounds} round(s):")
  header = f"{'size':<6}" + "".join(f"{c:>20}" for c in figures[sizes[0]])
  print(header + f"{'normstudy/torch':>18}" + (f"{'normstudy/nanodo':>18}" if args.nanodo_root
                                               else ""))
  summary = {}
  for size in sizes:
    medians = {c: statistics.median(v) for c, v in figures[size].items()}
    ratios = {f"normstudy/{p}": medians["normstudy"] / medians[p]
              for p in ("torch", "nanodo") if p in medians}
    per_round = {f"normstudy/{p}": [a / b for a, b in zip(figures[size]["normstudy"],
                                                          figures[size][p])]
                 for p in ("torch", "nanodo") if p in medians}
    summary[size] = {"median_tokens_per_s": medians, "ratios": ratios,
                     "per_round_ratios": per_round,
                     "median_per_round_ratio": {k: statistics.median(v)
                                                for k, v in per_round.items()}}
    print(f"{size:<6}" + "".join(f"{medians[c]:>20.0f}" for c in figures[size])
          + "".join(f"{r:>17.2f}x" for r in ratios.values()))
  for size in sizes:
    for name, values in summary[size]["per_round_ratios"].items():
      print(f"{size} {name} per round: " + ", ".join(f"{v:.2f}x" for v in values)
            + f" (median {statistics.median(values):.2f}x)")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"rounds": figures, "summary": summary, "load_start": load_start,
                 "load_end": load_end, "steps_per_window": args.steps}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()

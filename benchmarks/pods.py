"""The seed figure's four arms at the paper's size, compiled for a v5e:4x4 pod on this machine
(python -m normstudy.compile, the TPU compiler from `make tpu-aot`), under each model.remat:

  python benchmarks/pods.py [--topology=v5e:4x4] [--out=docs/pods/paper_v5e_4x4.csv]

MERT's encoder: 24 layers, d_model 1024, 16 heads, d_ff 4096, 512 tokens a row, vocab 32768,
float16, batch 64, the parameters and optimizer state sharded over all 16 chips (mesh.fsdp=16).
Prints a row per (arm, remat) and writes them as CSV (docs/reference.md's pod table quotes it);
then a 125M causal LM (GPT-2 small's shape) on v5e:4x4 and on a tensor-parallel v4:2x2x4 mesh
(docs/pods/lm_125m.csv; v4 as megacore: 16 chips, one device each), and a 350M LM on v5e:2x4 at
batch 64, 128 and 256 (docs/pods/lm_350m_v5e_2x4.csv; `--only=lm_350m` compiles just those).
Columns: bytes per chip (arguments, temporaries, total) against the HBM the compiler states;
the memory plan for a TPU (plan_gib, its total; least_gib, the step scheduled as tightly as it
goes; expected_gib, the total where it fits the HBM, else the least: normstudy.engine.memory)
and compiled_over_plan (total / expected: tests/test_compile.py holds it within 25% at these
sizes). `--replan` rewrites the plan columns of the committed CSVs from the current
normstudy.engine.memory without compiling (the compiled columns do not depend on the plan);
tflops_per_step_per_chip, counted from the model (every layer,
the remat forward and attention; normstudy.engine.memory.train_flops), beside compiler_tflops_per_chip
(XLA's cost analysis, which counts a loop's body once: about 1/L of a scanned stack);
collectives_per_step, each op times the trip counts of the loops around it, beside
collective_ops, the ops the program holds (each once).
"""

import argparse
import csv
import json
import os
import subprocess
import sys

from normstudy.engine import memory  # plain arithmetic, no jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
        "pre_norm_attn_relax_clip1")
PAPER = {"model.num_layers": 24, "model.d_model": 1024, "model.num_heads": 16,
         "model.d_ff": 4096, "model.max_len": 512, "model.vocab_size": 32768,
         "train.batch_size": 64, "mesh.fsdp": 16, "mesh.data": 1}
GIB = 2**30
# A 125M causal LM (GPT-2 small's shape) in bfloat16: on v5e:4x4 at batch 256 x 1024, and on
# v4:2x2x4 with a tensor-parallel mesh.
GPT2_SMALL = {"model.num_layers": 12, "model.d_model": 768, "model.num_heads": 12,
              "model.d_ff": 3072, "model.max_len": 1024, "model.vocab_size": 50304,
              "model.dtype": "bfloat16", "model.remat": "block"}
LM_CASES = {
    "gpt2_small/v5e:4x4/fsdp16/batch256": ("v5e:4x4", {"train.batch_size": 256, "mesh.fsdp": 16,
                                                       "mesh.data": 1}),
    "gpt2_small/v4:2x2x4/fsdp4_tensor4/batch64": ("v4:2x2x4", {
        "train.batch_size": 64, "mesh.fsdp": 4, "mesh.tensor": 4, "mesh.data": 1}),
}

# A 350M causal LM (24 x 1024, 16 heads, length 1024, GPT-2's vocabulary) in bfloat16 under block
# remat on v5e:2x4 (8 chips, fsdp 8) at three batch sizes (issue 86: the memory plan against the
# compiler as the batch grows to the chip's memory): docs/pods/lm_350m_v5e_2x4.csv.
LM_350M = {**GPT2_SMALL, "model.num_layers": 24, "model.d_model": 1024, "model.num_heads": 16,
           "model.d_ff": 4096}
LM_350M_CASES = {
    f"lm_350m/v5e:2x4/fsdp8/batch{batch}": ("v5e:2x4", {"train.batch_size": batch,
                                                       "mesh.fsdp": 8, "mesh.data": 1})
    for batch in (64, 128, 256)}


def compile_arm(arm: str, remat: str, topology: str, spec: str = "", overrides=None) -> dict:
  args = [sys.executable, "-m", "normstudy.compile",
          f"--config={spec or 'configs/seed_figure.py:' + arm}", f"--topology={topology}",
          f"--config.model.remat={remat}", "--json"]
  args += [f"--config.{field}={value}" for field, value in (overrides or PAPER).items()]
  result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
  if result.returncode not in (0, 1):
    raise SystemExit(result.stderr[-3000:])
  figures = json.loads(result.stdout)
  def counts(found):
    return "; ".join(f"{op} {v['count']}" for op, v in found.items()
                     if op != "loops_unknown" and v["count"])

  return {"arm": f"{arm}/{remat}", "remat": remat, "fits": figures["fits"],
          "arguments_gib": figures["per_chip_bytes"]["arguments"] / GIB,
          "temporaries_gib": figures["per_chip_bytes"]["temporaries"] / GIB,
          "total_gib": figures["per_chip_bytes"]["total"] / GIB,
          "hbm_gib": figures["hbm_bytes"] / GIB,
          **_plan_columns(figures["per_chip_bytes"]["total"], figures["hbm_bytes"],
                          memory.MemoryPlan(**{k: v for k, v in figures["plan"].items()
                                               if k != "total"})),
          "tflops_per_step_per_chip": figures["flops_per_step"] / 1e12,
          "compiler_tflops_per_chip": (figures["xla_cost_analysis_flops"] or float("nan")) / 1e12,
          "collectives_per_step": counts(figures["collectives_per_step"]),
          "collective_ops": counts(figures["collectives"])}


def _plan_columns(total: float, hbm: float, plan) -> dict:
  """The plan's columns (a memory.MemoryPlan; bytes in, GiB out): what the compiler allocates
  against what the plan expects on a chip of `hbm` bytes."""
  expected = plan.expected(hbm)
  return {"plan_gib": plan.total / GIB, "least_gib": plan.least / GIB,
          "expected_gib": expected / GIB, "compiled_over_plan": total / expected}


def case_config(arm: str):
  """The config (a ConfigDict) and mesh sizes of a row of the pods CSVs, by its arm column."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  if arm.startswith(("gpt2_small/", "lm_350m/")):
    cases, sizes = (LM_CASES, GPT2_SMALL) if arm.startswith("gpt2") else (LM_350M_CASES, LM_350M)
    spec, fields = "configs/lm.py:base", {**sizes, **cases[arm][1]}
    topology = cases[arm][0]
  else:
    name, remat = arm.split("/")
    spec, fields = f"configs/seed_figure.py:{name}", {**PAPER, "model.remat": remat}
    topology = "v5e:4x4"
  path, variant = spec.split(":")
  loader = importlib.util.spec_from_file_location("config", os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(loader)
  loader.loader.exec_module(module)
  config = module.get_config(variant)
  for field, value in fields.items():
    section, key = field.split(".")
    config[section][key] = value
  chips = 1
  for n in topology.split(":")[1].split("x"):
    chips *= int(n)
  sizes = {"runs": 1, "fsdp": config.mesh.fsdp, "tensor": config.mesh.tensor}
  sizes["data"] = chips // (sizes["fsdp"] * sizes["tensor"])
  return config, sizes


def replan(path: str) -> None:
  """Rewrite `path`'s plan columns from normstudy.engine.memory (a TPU's plan)."""
  with open(path, encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    config, sizes = case_config(row["arm"])
    plan = memory.plan(config, sizes, platform="tpu")
    row.update(_plan_columns(float(row["total_gib"]) * GIB, float(row["hbm_gib"]) * GIB, plan))
  columns = list(rows[0])
  ordered = [c for c in columns if c not in ("least_gib", "expected_gib", "compiled_over_plan")]
  at = ordered.index("plan_gib") + 1
  ordered[at:at] = ["least_gib", "expected_gib", "compiled_over_plan"]
  _write([{c: row[c] for c in ordered} for row in rows], path)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v5e:4x4")
  parser.add_argument("--out", default=os.path.join(ROOT, "docs", "pods", "paper_v5e_4x4.csv"))
  parser.add_argument("--only", choices=("lm_350m",), help="only these cases (lm_350m: "
                      "docs/pods/lm_350m_v5e_2x4.csv, three compiles)")
  parser.add_argument("--replan", action="store_true", help="rewrite the plan columns of "
                      "docs/pods/*.csv from the current memory plan, compiling nothing")
  args = parser.parse_args()
  if args.replan:
    folder = os.path.dirname(args.out)
    if not os.path.isdir(folder):
      print(f"error: --out={args.out}: its folder {folder} does not exist; --replan rewrites "
            "the CSVs there (docs/pods by default)", file=sys.stderr)
      sys.exit(2)
    for name in sorted(os.listdir(folder)):
      if name.endswith(".csv"):
        replan(os.path.join(folder, name))
    return
  if args.only == "lm_350m":
    _write(_lm_rows(LM_350M_CASES, LM_350M),
           os.path.join(os.path.dirname(args.out), "lm_350m_v5e_2x4.csv"))
    return
  rows = []
  for arm in ARMS:
    for remat in ("none", "dots", "block"):
      row = compile_arm(arm, remat, args.topology)
      rows.append(row)
      print(f"{row['arm']:<38} fits {str(row['fits']):<5} total {row['total_gib']:6.2f} of "
            f"{row['hbm_gib']:.2f} GiB (plan {row['plan_gib']:.2f}), "
            f"{row['tflops_per_step_per_chip']:.3g} TFLOP/step/chip (compiler "
            f"{row['compiler_tflops_per_chip']:.3g}); per step {row['collectives_per_step']}",
            flush=True)
  _write(rows, args.out)
  _write(_lm_rows(LM_CASES, GPT2_SMALL), os.path.join(os.path.dirname(args.out), "lm_125m.csv"))
  _write(_lm_rows(LM_350M_CASES, LM_350M),
         os.path.join(os.path.dirname(args.out), "lm_350m_v5e_2x4.csv"))


def _lm_rows(cases: dict, sizes: dict) -> list:
  """A row per LM case ({name: (topology, overrides)}), compiled under block remat."""
  rows = []
  for name, (topology, overrides) in cases.items():
    row = compile_arm(name, "block", topology, "configs/lm.py:base", {**sizes, **overrides})
    row["arm"] = name
    rows.append(row)
    print(f"{name:<42} fits {str(row['fits']):<5} total {row['total_gib']:6.2f} of "
          f"{row['hbm_gib']:.2f} GiB (plan {row['plan_gib']:.2f}); "
          f"{row['tflops_per_step_per_chip']:.3g} TFLOP/step/chip; "
          f"per step {row['collectives_per_step']}", flush=True)
  return rows


def _write(rows, path):
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()

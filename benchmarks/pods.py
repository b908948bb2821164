"""The seed figure's four arms at the paper's size, compiled for a v5e:4x4 pod on this machine
(python -m normstudy.compile, the TPU compiler from `make tpu-aot`), under each model.remat:

  python benchmarks/pods.py [--topology=v5e:4x4] [--out=docs/pods/paper_v5e_4x4.csv]

MERT's encoder: 24 layers, d_model 1024, 16 heads, d_ff 4096, 512 tokens a row, vocab 32768,
float16, batch 64, the parameters and optimizer state sharded over all 16 chips (mesh.fsdp=16).
Prints a row per (arm, remat) and writes them as CSV (the README's pod table quotes it).
"""

import argparse
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
        "pre_norm_attn_relax_clip1")
PAPER = {"model.num_layers": 24, "model.d_model": 1024, "model.num_heads": 16,
         "model.d_ff": 4096, "model.max_len": 512, "model.vocab_size": 32768,
         "train.batch_size": 64, "mesh.fsdp": 16, "mesh.data": 1}
GIB = 2**30


def compile_arm(arm: str, remat: str, topology: str) -> dict:
  args = [sys.executable, "-m", "normstudy.compile", f"--config=configs/seed_figure.py:{arm}",
          f"--topology={topology}", f"--config.model.remat={remat}", "--json"]
  args += [f"--config.{field}={value}" for field, value in PAPER.items()]
  result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
  if result.returncode not in (0, 1):
    raise SystemExit(result.stderr[-3000:])
  figures = json.loads(result.stdout)
  used = {op: v["count"] for op, v in figures["collectives"].items() if v["count"]}
  return {"arm": f"{arm}/{remat}", "remat": remat, "fits": figures["fits"],
          "arguments_gib": figures["per_chip_bytes"]["arguments"] / GIB,
          "temporaries_gib": figures["per_chip_bytes"]["temporaries"] / GIB,
          "total_gib": figures["per_chip_bytes"]["total"] / GIB,
          "hbm_gib": figures["hbm_bytes"] / GIB, "plan_gib": figures["plan"]["total"] / GIB,
          "tflops_per_chip": (figures["flops"] or float("nan")) / 1e12,
          "collectives": "; ".join(f"{op} {n}" for op, n in used.items())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v5e:4x4")
  parser.add_argument("--out", default=os.path.join(ROOT, "docs", "pods", "paper_v5e_4x4.csv"))
  args = parser.parse_args()
  rows = []
  for arm in ARMS:
    for remat in ("none", "dots", "block"):
      row = compile_arm(arm, remat, args.topology)
      rows.append(row)
      print(f"{row['arm']:<38} fits {str(row['fits']):<5} total {row['total_gib']:6.2f} of "
            f"{row['hbm_gib']:.2f} GiB (plan {row['plan_gib']:.2f}), "
            f"{row['tflops_per_chip']:.3g} TFLOP/step/chip; {row['collectives']}", flush=True)
  with open(args.out, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

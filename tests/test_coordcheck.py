"""The coordinate check (normstudy.coordcheck): under muP each block's output keeps its scale as the
model widens from 16 to 256; under sp it grows with the width."""

import pandas as pd
import pytest

import runs

SMALL = ("--config=configs/ladder.py:pre_norm_clip1", "--config.model.dtype=float32",
         "--config.model.base_width=16", "--config.model.num_layers=2",
         "--config.model.max_len=16", "--config.train.batch_size=8")


@pytest.mark.slow
def test_under_mup_the_coordinates_stay_flat_in_width_and_under_sp_they_grow(tmp_path):
  runs.run_inline("normstudy.coordcheck", *SMALL, "--widths=16,32,64,128,256",
                  "--parametrizations=sp,mup", f"--workdir={tmp_path}")
  table = pd.read_csv(tmp_path / "coordcheck.csv")
  assert list(table.columns) == ["parametrization", "width", "step", "layer", "quantity", "rms"]
  assert (tmp_path / "coordcheck.png").exists()
  recorded = runs.read_json(tmp_path / "coordcheck.json")
  assert recorded["command"].startswith("python -m normstudy.coordcheck --config=configs/ladder")
  assert recorded["learning_rates"] == {"sp": 3e-3, "mup": 3e-3}
  # Step 0's update is no change at all; every later one is some.
  updates = table[table.quantity == "update"]
  assert (updates[updates.step == 0].rms == 0).all()
  assert (updates[updates.step > 0].rms > 0).all()
  blocks = table[(table.step == 10) & (table.quantity == "output")
                 & table.layer.str.startswith("layer_")]
  spread = blocks.groupby(["parametrization", "layer"]).rms.agg(lambda r: r.max() / r.min())
  assert (spread["mup"] <= 1.5).all(), spread
  # sp at the recipe's rate: each block's output grows with the width, by more than 10x from
  # 16 to 256 (56x and 62x measured on an AMD EPYC).
  for layer, rows in blocks[blocks.parametrization == "sp"].groupby("layer"):
    rms = rows.sort_values("width").rms.to_numpy()
    assert (rms[1:] > rms[:-1]).all(), (layer, rms)
    assert rms[-1] / rms[0] > 10, (layer, rms)


@pytest.mark.parametrize("flag,message", [
    ("--widths=16,abc", "--widths=16,abc is not allowed; allowed: a comma-separated list of "
                        "ints >= 1"),
    ("--parametrizations=sp,xp", "--parametrizations=sp,xp is not allowed; allowed: a "
                                 "comma-separated list of sp, mup, completep, umup"),
    ("--learning_rates=0.1", "--learning_rates gives 1 rates for 3 parametrizations; give one "
                             "each"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, flag, message):
  result = runs.run_module("normstudy.coordcheck", *SMALL, flag, f"--workdir={tmp_path / 'out'}",
                           check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == f"error: {message}"
  assert not (tmp_path / "out").exists()

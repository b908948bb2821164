"""The benchmarks' model sizes (`make benchmark`, benchmarks/throughput.py, gpu.py, trees.py,
grids.py): decoder-only, float32, Adam, clip 1.0, with the model the peer harness
(../shared/peer) times: tanh GELU, no biases, learned positions. `--config=configs/benchmark.py:S`
trains one as any config does.
"""

from normstudy.core import config as config_lib
from normstudy.core.experiment import Experiment

SIZES = {
    # name: (d_model, heads, layers, d_ff, length, vocab, batch)
    "S": (128, 4, 4, 512, 128, 256, 16),
    "M": (256, 4, 6, 1024, 256, 4096, 16),
}


def base_config():
  """The sizes' shared recipe: a causal float32 decoder, Adam without decay, clip 1, constant
  rate."""
  config = config_lib.default_config()
  config.model.update(causal=True, dtype="float32", activation="gelu_tanh", use_bias=False,
                      position_embedding="learned")
  config.optimizer.update(name="adam", weight_decay=0.0, clip_norm=1.0, warmup_steps=0,
                          schedule="constant")
  config.train.update(num_steps=1000)
  return config


EXPERIMENT = Experiment(
    base=base_config, arm_kind="size",
    arms={name: ("", {"model.d_model": d, "model.num_heads": heads, "model.num_layers": layers,
                      "model.d_ff": ff, "model.max_len": length, "model.vocab_size": vocab,
                      "train.batch_size": batch})
          for name, (d, heads, layers, ff, length, vocab, batch) in SIZES.items()})

get_config = EXPERIMENT.get_config

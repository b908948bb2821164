"""The ladder's next rungs, for one GPU: the same arms, instrument and text as configs/ladder.py
at sizes this project's 2-core CPU cannot reach (issue 42, item 4).

  python -m normstudy.ladder --config=configs/ladder_gpu.py --workdir=runs/ladder

Run it into the CPU ladder's directory (`make ladder`'s runs/ladder, or a copy of it): the new
rungs land beside the old ones (<dtype>/L<layers>_d<width>), and the analysis then fits every
rung, so the held-out test (the largest rung predicted from the others) is repeated at a size
the CPU ladder only extrapolated to. The rungs run the widths 256 to 1024 at 12 layers and the
depths 12 and 24 at width 512, the top rung MERT's 24 x 1024 shape; rows are as long as the
CPU ladder's (64 tokens), so size is the only thing that changes. Each rung is the CPU ladder's
search (same bracket, rounds, seeds and horizon).

Runtime was not measured (no GPU was lent while this was written). By the 6 N D rule the file
is 4.1e16 FLOPs of training (rungs of 9.6M to 304M parameters, 581M together; per rung and
dtype 4 arms x 2 seeds x 6 runs x 120 steps x 1024 tokens): about 40 s at an H200's dense
float16 peak, float32 several times that; runs this small are dispatch- and compile-bound, so
expect tens of minutes rather than seconds, most of it compiling 2 dtypes x 5 rungs x 4 arms
x 2 run counts = 80 programs (docs/results.md, "Does it transfer?").
"""

from configs import ladder

# The CPU ladder's arms, recipe, search and rung fields; only the rungs differ.
VARIANTS = ladder.VARIANTS
SWEEP_VARIANTS = ladder.SWEEP_VARIANTS
STUDY_VARIANTS = ladder.STUDY_VARIANTS
SWEEP = ladder.SWEEP
SWEEP_SETTINGS = ladder.SWEEP_SETTINGS
LADDER_DTYPES = ladder.LADDER_DTYPES
LADDER_SEARCH = ladder.LADDER_SEARCH
rung_overrides = ladder.rung_overrides
base_config = ladder.base_config
get_config = ladder.get_config

LADDER_RUNGS = [(12, 256), (12, 512), (12, 1024), (24, 512), (24, 1024)]

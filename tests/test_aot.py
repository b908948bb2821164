"""normstudy.engine.aot without a TPU compiler: the collectives one step executes, counted from
an optimized HLO module's text (each op times the trip counts of the loops around it), against
counts made by hand on a module written for it."""

from normstudy.engine import aot

# A module in the form XLA prints optimized programs: a loop of 24 trips (a scanned layer stack)
# holding an all-gather and a call to a computation with an all-reduce; inside it a loop of 3
# (a windowed matmul) with a collective-permute; a conditional whose branches differ; a loop
# whose condition states no constant bound; and one all-reduce in the entry.
MODULE = """HloModule jit_step, entry_computation_layout={()}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%reduce_grads (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %all-reduce.7 = f32[8]{0} all-reduce(%p), channel_id=3, replica_groups={{0,1}}, to_apply=%add
}

%window_cond (w: (s32[], f32[4])) -> pred[] {
  %w = (s32[], f32[4]{0}) parameter(0)
  %constant.3 = s32[]{:T(128)} constant(3)
  %gte.1 = s32[] get-tuple-element(%w), index=0
  ROOT %lt.1 = pred[] compare(%gte.1, %constant.3), direction=LT
}

%window_body (v: (s32[], f32[4])) -> (s32[], f32[4]) {
  %v = (s32[], f32[4]{0}) parameter(0)
  %gte.2 = f32[4]{0} get-tuple-element(%v), index=1
  %collective-permute.1 = f32[4]{0} collective-permute(%gte.2), channel_id=5, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (s32[], f32[4]{0}) tuple(%gte.3, %collective-permute.1)
}

%layers_cond (c: (s32[], bf16[2,16])) -> pred[] {
  %c = (s32[], bf16[2,16]{1,0}) parameter(0)
  %constant.24 = s32[]{:T(128)} constant(24)
  %gte.4 = s32[] get-tuple-element(%c), index=0
  ROOT %lt.2 = pred[] compare(%gte.4, %constant.24), direction=LT
}

%layers_body (l: (s32[], bf16[2,16])) -> (s32[], bf16[2,16]) {
  %l = (s32[], bf16[2,16]{1,0}) parameter(0)
  %all-gather.1 = bf16[2,16]{1,0} all-gather(%x), channel_id=1, dimensions={1}
  %call.1 = f32[8]{0} call(%y), to_apply=%reduce_grads
  %while.2 = (s32[], f32[4]{0}) while(%z), condition=%window_cond, body=%window_body
  ROOT %t2 = (s32[], bf16[2,16]{1,0}) tuple(%i, %all-gather.1)
}

%small_branch (s: f32[2]) -> f32[2] {
  %s = f32[2]{0} parameter(0)
  ROOT %all-to-all.1 = f32[2]{0} all-to-all(%s), channel_id=8, dimensions={0}
}

%large_branch (g: f32[64]) -> f32[64] {
  %g = f32[64]{0} parameter(0)
  ROOT %all-to-all.2 = f32[64]{0} all-to-all(%g), channel_id=9, dimensions={0}
}

%open_cond (o: (s32[], f32[])) -> pred[] {
  %o = (s32[], f32[]) parameter(0)
  %gte.5 = f32[] get-tuple-element(%o), index=1
  ROOT %lt.3 = pred[] compare(%gte.5, %gte.5), direction=LT
}

%open_body (q: (s32[], f32[])) -> (s32[], f32[]) {
  %q = (s32[], f32[]) parameter(0)
  %all-reduce-start.2 = f32[] all-reduce-start(%r), channel_id=11, to_apply=%add
  %all-reduce-done.2 = f32[] all-reduce-done(%all-reduce-start.2)
  ROOT %t3 = (s32[], f32[]) tuple(%i, %all-reduce-done.2)
}

ENTRY %main (arg: bf16[2,16]) -> bf16[2,16] {
  %arg = bf16[2,16]{1,0} parameter(0)
  %while.1 = (s32[], bf16[2,16]{1,0}) while(%init), condition=%layers_cond, body=%layers_body, metadata={op_name="while"}
  %conditional.1 = f32[64]{0} conditional(%pred, %a1, %a2), branch_computations={%small_branch, %large_branch}
  %while.3 = (s32[], f32[]) while(%init2), condition=%open_cond, body=%open_body
  %all-reduce.9 = f32[16]{0} all-reduce(%u), channel_id=12, to_apply=%add
  ROOT %out = bf16[2,16]{1,0} get-tuple-element(%while.1), index=1
}
"""


def test_each_collective_counts_once_per_trip_of_every_loop_around_it():
  per_step = aot.collectives_per_step(MODULE)
  # By hand: 24 layer trips x one all-gather of bf16[2,16] (64 B).
  assert per_step["all-gather"] == {"count": 24, "bytes": 24 * 64}
  # 24 x the called all-reduce (f32[8], 32 B) + the open loop's once (f32[], 4 B) + the
  # entry's (f32[16], 64 B).
  assert per_step["all-reduce"] == {"count": 24 + 1 + 1, "bytes": 24 * 32 + 4 + 64}
  # 24 layer trips x 3 window trips x f32[4] (16 B).
  assert per_step["collective-permute"] == {"count": 72, "bytes": 72 * 16}
  # The conditional's costlier branch only: f32[64].
  assert per_step["all-to-all"] == {"count": 1, "bytes": 256}
  assert per_step["reduce-scatter"] == {"count": 0, "bytes": 0}
  assert per_step["loops_unknown"] == 1


def test_the_programs_ops_count_each_op_once():
  static = aot.collectives(MODULE)
  assert {op: v["count"] for op, v in static.items()} == {
      "all-gather": 1, "reduce-scatter": 0, "all-reduce": 3, "all-to-all": 2,
      "collective-permute": 1}

"""The kernels `attn-chunk-recurrence` writes, one module per part (the math is in the pass's
docstring, passes/chunk_recurrence.py):

* `kernel`: what every kernel of the rewrite shares: the op's operands and shapes, loading (and
  modding) tiles of q, k and v, the program ids, the loop over chunks, the kernel function.
* `decay`: the cumulative log-decay G of a chunk and its total G_end, for each decay kind.
* `step`: the math of one chunk: its output rows, the next state, the next key sum.
* `sequential`: the one-kernel form, carrying the state through all chunks.
* `split`: the split form's cumulative-decay, chunk-state and chunk-parallel output kernels.
* `blocked`: blocks of SUB rows of a chunk, factorized at their boundaries: the per-dimension
  decays' chunks past the span limit, and the values'-decay ("token_value_dim") output kernel a
  program per block (f16 operands).
* `scores`: the per-dimension decays' scores kernel, a program per chunk, and the output
  kernels that read its workspace.
"""

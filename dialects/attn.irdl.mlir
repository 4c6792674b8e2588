// The `attn` dialect: attention written as modular ops on [B, H, L, D] tensors (level L0).
//
// IRDL checks the structure of each op (operand/result kinds, attribute kinds, region counts);
// the shape rules that IRDL cannot state (matching B/D, GQA divisibility, region signatures) are
// checked by `ae_mlir.verifier`, which `ae-opt` and the frontend run after parsing.
//
// IRDL cannot declare terminators, so mod regions end with the upstream `gpu.yield`, a generic
// terminator with no parent constraint. Region block arguments, in order:
//   score_mod : (score: f32, b: index, h: index, q_idx: index, kv_idx: index) -> f32
//   mask      : (b: index, h: index, q_idx: index, kv_idx: index) -> i1
//   q/k/v mod : (x: f32, b: index, h: index, t: index, d: index) -> f32
// Closure tensors a mod reads (slopes[h], doc[q_idx]) are arguments of the enclosing function
// that the region uses directly (`tensor.extract`), as an scf.for body uses outer values. They
// are not operands of the op because IRDL gives all values of a variadic operand one type, and
// captured tensors differ in shape and element type.
irdl.dialect @attn {
  // scores[b, h, i, j] = scale * sum_d q[b, h, i, d] * k[b, h // (H / Hkv), j, d]  (f32)
  irdl.operation @score {
    %q = irdl.base "!builtin.tensor"
    %k = irdl.base "!builtin.tensor"
    %s = irdl.base "!builtin.tensor"
    %scale = irdl.base "#builtin.float"
    irdl.operands(q: %q, k: %k)
    irdl.results(scores: %s)
    irdl.attributes {"scale" = %scale}
  }

  // out[b, h, i, j] = body(scores[b, h, i, j], b, h, i, j)
  irdl.operation @score_mod {
    %s = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(scores: %s)
    irdl.results(out: %out)
    %body = irdl.region
    irdl.regions(body: %body)
  }

  // keep[b, h, i, j] = body(b, h, i, j); the result type fixes [B, H, Lq, Lk]. With the
  // optional `kv_len` (tensor<B x i32>, each batch entry's number of keys), keep also requires
  // j < kv_len[b] (a length is clamped into [0, Lk]).
  irdl.operation @mask {
    %n = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(kv_len: optional %n)
    irdl.results(keep: %out)
    %body = irdl.region
    irdl.regions(body: %body)
  }

  // Row normalization of scores (masked entries contribute nothing). `kind` is one of
  // "softmax", "sigmoid", "relu", "none" (the regions stay empty) or "online", a user-defined
  // normalizer given by its regions (see ae_mlir/normalizers.py):
  //   prob (s, m) -> p; rescale (m_old, m_new) -> alpha, present iff the normalizer keeps the
  //   running row max m (m is 0 otherwise); finalize (acc, l) -> out, linear in acc.
  // For "online", probs[b, h, i, j] = finalize(prob(s_ij, m_i), l_i) with m_i the row max of the
  // visible scores (0 for a row with none) and l_i the row sum of prob over visible entries.
  // The optional second result is the row logsumexp (softmax only).
  irdl.operation @normalize {
    %s = irdl.base "!builtin.tensor"
    %m = irdl.base "!builtin.tensor"
    %p = irdl.base "!builtin.tensor"
    %lse = irdl.base "!builtin.tensor"
    %kind = irdl.base "#builtin.string"
    irdl.operands(scores: %s, keep: optional %m)
    irdl.results(probs: %p, lse: optional %lse)
    irdl.attributes {"kind" = %kind}
    %prob = irdl.region
    %rescale = irdl.region
    %finalize = irdl.region
    irdl.regions(prob: %prob, rescale: %rescale, finalize: %finalize)
  }

  // The keys (or values) of a paged KV cache as the [B, Hkv, M * S, D] tensor attn.score and
  // attn.aggregate read: result[b, h, j, :] = pages[table[b, j / S], h, j % S, :] for pages
  // [P, Hkv, S, D] and the block table [B, M] (i32); a page number outside [0, P) is clamped
  // into it. The tiling reads the pages in place; nothing gathers them into a tensor.
  irdl.operation @gather_pages {
    %pages = irdl.base "!builtin.tensor"
    %table = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(pages: %pages, table: %table)
    irdl.results(keys: %out)
  }

  // Packed variable-length sequences (FlashAttention's cu_seqlens, tensor<S+1 x i32>): sequence
  // s holds rows cu[s] .. cu[s+1] - 1 of a packed [1, H, T(, D)] tensor. unpack_sequences is the
  // [S, H, L(, D)] view of them: row i of sequence s is packed row cu[s] + i for i < cu[s+1] - cu[s]
  // and zero past it (L bounds the longest sequence). The tiling reads the packed rows in place.
  // T may be dynamic (`?`): a module then serves packed batches of any total row count.
  irdl.operation @unpack_sequences {
    %packed = irdl.base "!builtin.tensor"
    %cu = irdl.base "!builtin.tensor"
    %view = irdl.base "!builtin.tensor"
    irdl.operands(packed: %packed, cu_seqlens: %cu)
    irdl.results(view: %view)
  }

  // The inverse: a [S, H, L(, D)] result written back to packed rows [1, H, T(, D)], row i of
  // sequence s to packed row cu[s] + i; packed rows outside every sequence are zero.
  irdl.operation @pack_sequences {
    %view = irdl.base "!builtin.tensor"
    %cu = irdl.base "!builtin.tensor"
    %packed = irdl.base "!builtin.tensor"
    irdl.operands(view: %view, cu_seqlens: %cu)
    irdl.results(packed: %packed)
  }

  // out[b, h, i, :] = sum_j probs[b, h, i, j] * v[b, h // (H / Hkv), j, :], accumulated in f32
  // and converted to the result's element type.
  irdl.operation @aggregate {
    %p = irdl.base "!builtin.tensor"
    %v = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(probs: %p, v: %v)
    irdl.results(out: %out)
  }

  // ---- derivatives (written by attn-differentiate into a function `<name>_grad`) -------------
  // Their regions take (score: f32, grad: f32, b, h, q_idx, kv_idx: index), where score is the
  // score_mod's input and grad the gradient with respect to its output.

  // d_scores[b, h, i, j] = body(scores[b, h, i, j], grad[b, h, i, j], b, h, i, j): the chain
  // rule through a score_mod.
  irdl.operation @score_mod_grad {
    %s = irdl.base "!builtin.tensor"
    %g = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(scores: %s, grad: %g)
    irdl.results(d_scores: %out)
    %body = irdl.region
    irdl.regions(body: %body)
  }

  // The gradient of a float closure tensor that a score_mod reads with tensor.extract. The body
  // yields one group (value: f32, index_0, ..., index_{r-1}: index) per read of `closure` (rank
  // r); d_closure (f32, the closure's shape) starts at zero and every grid point (b, h, i, j)
  // adds each group's value at its indices.
  irdl.operation @closure_grad {
    %s = irdl.base "!builtin.tensor"
    %g = irdl.base "!builtin.tensor"
    %c = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(scores: %s, grad: %g, closure: %c)
    irdl.results(d_closure: %out)
    %body = irdl.region
    irdl.regions(body: %body)
  }

  // The gradient of attn.normalize's scores from d_probs, the gradient of its probs (P). Built-in
  // kinds, regions empty, masked entries get 0:
  //   softmax: P * (d_probs - rowsum(P * d_probs)); sigmoid: d_probs * P * (1 - P);
  //   relu: d_probs where the score is > 0; none: d_probs.
  // "online": prob and finalize are the normalizer's own regions; prob_grad (s, m, g) yields
  // (g * dprob/ds, g * dprob/dm) and finalize_grad (acc, l, g) yields (g * dfinalize/dacc,
  // g * dfinalize/dl). With stat = "max", m is the row max of the visible scores and its gradient
  // goes to the entries equal to it, split evenly; with "none", m is 0.
  irdl.operation @normalize_grad {
    %s = irdl.base "!builtin.tensor"
    %m = irdl.base "!builtin.tensor"
    %dp = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    %kind = irdl.base "#builtin.string"
    %stat = irdl.base "#builtin.string"
    irdl.operands(scores: %s, keep: optional %m, d_probs: %dp)
    irdl.results(d_scores: %out)
    irdl.attributes {"kind" = %kind, "stat" = %stat}
    %prob = irdl.region
    %finalize = irdl.region
    %prob_grad = irdl.region
    %finalize_grad = irdl.region
    irdl.regions(prob: %prob, finalize: %finalize, prob_grad: %prob_grad, finalize_grad: %finalize_grad)
  }

  // Linear attention as a recurrence over time (see DESIGN.md section 3):
  //   S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,  o_t = scale * q_t S_t,  S_0 = initial_state or 0,
  // after the q/k/v mod regions (empty region: identity) are applied elementwise.
  // `decay` is "none", "head" (g [H]), "token" (g [B, H, L]), "token_dim" (g [B, H, L, Dk]) or
  // "token_value_dim" (g [B, H, L, Dv]: S_t = S_{t-1} diag(exp(g_t)) + k_t^T v_t, the state's
  // columns decayed; what GLA's gradients of q and k compute; no `normalize`).
  // `normalize` divides o_t by the same sum taken with v = 1. `chunk_size` is the lowering's
  // chunk length. Results: o [B, H, L, Dv] and the final state [B, H, Dk, Dv] (f32). q, k, v, g,
  // initial_state and o are f16, bf16, f32 or f64 (f64 runs on the reference executor only; the
  // verifier checks element types, the tensor constraints below take any). With `lengths` (i32
  // [B]), entry b holds lengths[b] tokens (clamped into [0, L]): the tokens after them leave the
  // state as it is and their output rows are zero, so padded batches and packed sequences
  // (attn.unpack_sequences views) carry exactly their own tokens' state.
  irdl.operation @linear_recurrence {
    %q = irdl.base "!builtin.tensor"
    %k = irdl.base "!builtin.tensor"
    %v = irdl.base "!builtin.tensor"
    %g = irdl.base "!builtin.tensor"
    %s0 = irdl.base "!builtin.tensor"
    %len = irdl.base "!builtin.tensor"
    %o = irdl.base "!builtin.tensor"
    %sn = irdl.base "!builtin.tensor"
    %decay = irdl.base "#builtin.string"
    %scale = irdl.base "#builtin.float"
    %norm = irdl.base "#builtin.integer"
    %chunk = irdl.base "#builtin.integer"
    irdl.operands(q: %q, k: %k, v: %v, g: optional %g, initial_state: optional %s0,
                   lengths: optional %len)
    irdl.results(out: %o, final_state: %sn)
    irdl.attributes {"decay" = %decay, "scale" = %scale, "normalize" = %norm,
                     "chunk_size" = %chunk}
    %qm = irdl.region
    %km = irdl.region
    %vm = irdl.region
    irdl.regions(q_mod: %qm, k_mod: %km, v_mod: %vm)
  }

  // ---- L1 (after attn-fuse-online-softmax / attn-tile) --------------------------------------

  // The fused online form of score -> [score_mod] -> [mask] -> normalize -> aggregate. Regions:
  //   score_mod (score, b, h, q_idx, kv_idx) -> f32   (empty: identity)
  //   mask      (b, h, q_idx, kv_idx) -> i1           (empty: keep all)
  //   prob (s, m) -> p, rescale (m_old, m_new) -> alpha, finalize (acc, l) -> out,
  //   lse_of (m, l) -> logsumexp: the online normalizer (see ae_mlir/normalizers.py); rescale is
  //   empty without a row statistic, lse_of empty without an lse result.
  // `stat` is "max" or "none"; with `log2_domain` the scores are scaled by log2(e) after the
  // score_mod, so prob/rescale/lse work in base 2. The optional `kv_len` is attn.mask's.
  irdl.operation @online_attention {
    %q = irdl.base "!builtin.tensor"
    %k = irdl.base "!builtin.tensor"
    %v = irdl.base "!builtin.tensor"
    %o = irdl.base "!builtin.tensor"
    %lse = irdl.base "!builtin.tensor"
    %scale = irdl.base "#builtin.float"
    %name = irdl.base "#builtin.string"
    %stat = irdl.base "#builtin.string"
    %log2 = irdl.base "#builtin.integer"
    %n = irdl.base "!builtin.tensor"
    irdl.operands(q: %q, k: %k, v: %v, kv_len: optional %n)
    irdl.results(out: %o, lse: optional %lse)
    irdl.attributes {"scale" = %scale, "normalizer" = %name, "stat" = %stat, "log2_domain" = %log2}
    %r0 = irdl.region
    %r1 = irdl.region
    %r2 = irdl.region
    %r3 = irdl.region
    %r4 = irdl.region
    %r5 = irdl.region
    irdl.regions(score_mod: %r0, mask: %r1, prob: %r2, rescale: %r3, finalize: %r4, lse_of: %r5)
  }

  // The id of the running program along a grid axis (0, 1 or 2) of a tiled kernel function;
  // the function's `attn.grid` attribute gives the grid's extent.
  irdl.operation @program_id {
    %i = irdl.is index
    %axis = irdl.base "#builtin.integer"
    irdl.results(id: %i)
    irdl.attributes {"axis" = %axis}
  }

  // dest[indices_0[i, j], ..., indices_{r-1}[i, j]] += values[i, j] for every element of the
  // tile, on a destination argument of rank r (f32) that the kernel accumulates into: several
  // programs add into one element, so the lowerings add atomically (GPUs) or into a private copy
  // per thread (CPU). An index outside the destination adds nothing. The result is the updated
  // destination. attn-tile-backward scatters the gradients of closure tensors with it.
  irdl.operation @scatter_add {
    %d = irdl.base "!builtin.tensor"
    %x = irdl.base "!builtin.tensor"
    %i = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    irdl.operands(dest: %d, values: %x, indices: variadic %i)
    irdl.results(result: %out)
  }
}

"""`torch.compile` over models that call `ae_mlir.attention`: one custom op in the graph, no graph
breaks, and the same training steps as eager (CPU backend, float32)."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae


class AttentionLayer(torch.nn.Module):
    """A learnable q/k/v projection, causal ae_mlir attention, and with `bias` a learnable
    relative-position bias table that the score_mod reads."""

    def __init__(self, dim=16, heads=2, bias=False):
        super().__init__()
        self.heads = heads
        self.proj = torch.nn.Linear(dim, 3 * dim)
        self.table = torch.nn.Parameter(0.1 * torch.randn(heads, 32)) if bias else None
        score_mod = (lambda s, b, h, i, j: s + self.table[h, i - j]) if bias else None
        self.attn = ae.attention(score_mod=score_mod, mask_mod=lambda b, h, i, j: i >= j, layout="blhd")

    def forward(self, x):
        b, l, d = x.shape
        q, k, v = self.proj(x).view(b, l, 3, self.heads, d // self.heads).unbind(2)
        return self.attn(q, k, v).reshape(b, l, d)


def _train(model, inputs, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x in inputs[:steps]:
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("bias", [False, True])
def test_compiled_training_matches_eager(bias, backend):
    # With inductor the projections around the attention op are compiled to C++ (the CPU
    # toolchain the README's install uses); the op itself runs ae-mlir's kernels either way.
    inputs = [torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    torch.manual_seed(0)
    eager = AttentionLayer(bias=bias)
    torch.manual_seed(0)
    model = AttentionLayer(bias=bias)
    explained = torch._dynamo.explain(model)(inputs[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    torch.testing.assert_close(_train(compiled, inputs), _train(eager, inputs), atol=1e-5, rtol=1e-5)
    for (name, got), (_, want) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


def test_a_transposed_learnable_table_trains_under_compile():
    # A bias table whose last dimension is not unit-strided reaches the kernels as a contiguous
    # copy (eager and compiled), and its gradient through the copy.
    inputs = [torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = AttentionLayer(bias=True)
        model.table = torch.nn.Parameter(model.table.detach().t().contiguous().t())
        assert model.table.stride(-1) != 1
        models.append(model)
    eager, model = models
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(_train(compiled, inputs), _train(eager, inputs), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.table, eager.table, atol=1e-5, rtol=1e-5)


def test_the_graph_holds_one_ae_mlir_op():
    seen = []

    def backend(graph_module, example_inputs):
        seen.extend(str(n.target) for n in graph_module.graph.nodes if n.op == "call_function")
        return graph_module.forward

    torch.manual_seed(0)
    model = AttentionLayer(bias=True)
    x = torch.randn(1, 7, 16)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(got, expected)
    assert seen.count("ae_mlir.attention.default") == 1


def test_logsumexp_under_compile():
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        out, lse = attn(q, k, v, return_lse=True)
        return out.sum() + lse.sum()

    expected = torch.autograd.grad(f(q, k, v), (q, k, v))
    got = torch.autograd.grad(torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_custom_ops_pass_opcheck():
    # Schema, fake implementations (shapes and strides of strided [B, L, H, D] views), autograd
    # registration and AOT dispatch, for a variant with a float and an integer closure tensor.
    from ae_mlir.frontend import closure_sources, torch_op

    table = torch.randn(2, 11, requires_grad=True)
    doc = torch.tensor([0, 0, 0, 1, 1, 1])
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + table[h, i - j + 5],
                        mask_mod=lambda b, h, i, j: doc[i] == doc[j])
    q = torch.randn(1, 6, 2, 4).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(1, 6, 2, 4).transpose(1, 2) for _ in range(2))
    closures = closure_sources.fetch(attn, attn._sources)
    # Without and with per-entry key lengths.
    for kv_len in (None, torch.tensor([4], dtype=torch.int32)):
        cache = (kv_len, None, None, None, 0, 0)
        torch.library.opcheck(torch_op.attention_op, (attn._key, "reference", q, k, v, closures, *cache))
        out, lse = torch_op.attention_op(attn._key, "reference", q, k, v, closures, *cache)
        torch.library.opcheck(torch_op.attention_backward_op, (
            attn._key, "reference", q.detach(), k, v, [t.detach() for t in closures], kv_len, None, None, 0, 0,
            lse.detach(), out.detach(), torch.randn(1, 2, 6, 4), None, [True, False]))


class _DocumentMask(torch.nn.Module):
    """A document mask whose document ids the model rebinds on every call, as a batch loop does."""

    def __init__(self):
        super().__init__()
        self.doc = torch.zeros(6, dtype=torch.long)
        self.attn = ae.attention(mask_mod=lambda b, h, i, j: self.doc[i] == self.doc[j])

    def forward(self, q, k, v, doc):
        self.doc = doc
        return self.attn(q, k, v, backend="reference")


def test_a_closure_tensor_rebound_per_call_is_read_anew():
    model = _DocumentMask()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    for doc in ([0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 2, 2]):
        doc = torch.tensor(doc)
        torch.testing.assert_close(compiled(q, k, v, doc), model(q, k, v, doc))


def _bias_layer():
    torch.manual_seed(0)
    return AttentionLayer(bias=True)


def test_a_reassigned_parameter_is_read_anew():
    model = _bias_layer()
    model.table = torch.nn.Parameter(torch.arange(64.0).view(2, 32) / 8)
    x = torch.randn(1, 7, 16)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(x)
    torch.testing.assert_close(got, model(x))
    got.square().mean().backward()
    assert model.table.grad is not None and model.table.grad.abs().sum() > 0


def test_a_deepcopy_is_a_variant_of_its_own():
    import copy
    import gc

    original = _bias_layer()
    clone = copy.deepcopy(original)
    # A deepcopy keeps the mod functions themselves, so the copy's mods read what the original's
    # read; compiled calls of the copy must read the same, through the copy's own key.
    assert clone.attn._key != original.attn._key
    del original
    gc.collect()
    x = torch.randn(1, 7, 16)
    torch.testing.assert_close(torch.compile(clone, backend="aot_eager", fullgraph=True)(x), clone(x))


def test_a_closure_tensor_without_a_source_is_refused_under_compile():
    tables = [torch.randn(2, 16)]
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + tables[0][h, i - j + 8])
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    with pytest.raises(Exception, match=r"closure tensor 0 \(shape \(2, 16\)\) that score_mod '<lambda>' reads .*"
                                        r"bind it to a name the mod reads directly"):
        torch.compile(lambda q, k, v: attn(q, k, v, backend="reference"), backend="aot_eager", fullgraph=True)(q, k, v)


def test_the_backward_outlives_the_model():
    import gc

    model = _bias_layer()
    x = torch.randn(1, 7, 16, requires_grad=True)
    out = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    del model
    gc.collect()
    out.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_constructing_inside_a_compiled_function_is_refused():
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))

    def f(q, k, v):
        return ae.attention(mask_mod=lambda b, h, i, j: i >= j)(q, k, v, backend="reference")

    with pytest.raises(Exception, match="construct ae.attention outside the compiled function"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_linear_attention_is_one_custom_op_under_torch_compile(backend):
    # No graph break: one ae_mlir::linear_attention op, forward and gradients (q, k, v, g and
    # the initial state) as eager, for a plain batch and a packed one.
    table = torch.tensor([0.5, -0.25])
    layer = ae.linear_attention(decay="token", layout="blhd", k_mod=lambda x, b, h, t, d: x * 0.5 + table[h])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, 2, 16, generator=gen, requires_grad=True)
    g = (-torch.rand(1, 32, 2, generator=gen)).requires_grad_()
    cu = torch.tensor([0, 5, 5, 32], dtype=torch.int32)
    s0 = torch.randn(3, 2, 16, 16, generator=gen, requires_grad=True)

    def loss(q, g, s0, packed):
        kw = dict(cu_seqlens=cu, max_seqlen=27) if packed else {}
        out, state = layer(q, 2 * q, torch.tanh(q), g, s0 if packed else s0[:1], return_state=True, **kw)
        return (out ** 2).sum() + state.sum()

    for packed in (False, True):
        explained = torch._dynamo.explain(loss)(q, g, s0, packed)
        assert explained.graph_break_count == 0
        compiled = torch.compile(loss, backend=backend, fullgraph=True)(q, g, s0, packed)
        got = torch.autograd.grad(compiled, (q, g, s0))
        eager = loss(q, g, s0, packed)
        want = torch.autograd.grad(eager, (q, g, s0))
        torch.testing.assert_close(compiled, eager)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_linear_attention_gradients_of_some_inputs_under_inductor():
    # Heads-first layout (dk comes back strided from autograd), only some inputs requiring grad,
    # and the state unused or used while only q requires grad (the state does not depend on q).
    layer = ae.linear_attention(decay="token")
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=gen) for _ in range(3))
    g = -torch.rand(1, 2, 24, generator=gen)

    def loss(q, k, v, with_state):
        out, state = layer(q, k, v, g, return_state=True)
        return (out ** 2).sum() + (state.sum() if with_state else 0)

    for wants in ((True, True, False), (True, False, False), (False, False, True)):
        for with_state in (False, True):
            leaves = [t.clone().requires_grad_(w) for t, w in zip((q, k, v), wants)]
            targets = [t for t in leaves if t.requires_grad]
            got = torch.autograd.grad(torch.compile(loss)(*leaves, with_state), targets)
            want = torch.autograd.grad(loss(*leaves, with_state), targets)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


def test_linear_attention_backward_refuses_rebound_closure_tensors_under_torch_compile():
    # The backward reapplies the mods, which read their closure variables: one rebound between
    # forward and backward would give the gradients of another function.
    table = torch.tensor([0.5, -0.25])
    layer = ae.linear_attention(k_mod=lambda x, b, h, t, d: x + table[h], layout="blhd")
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    out = torch.compile(lambda q: layer(q, q, q), backend="aot_eager", fullgraph=True)(q)
    table = torch.tensor([2.0, 3.0])  # noqa: F841 (the mod's closure cell now holds this tensor)
    with pytest.raises(RuntimeError, match="reads other closure tensors than it did in the forward"):
        out.sum().backward()


def test_closure_gradients_of_linear_attention_are_refused_under_torch_compile():
    table = torch.tensor([0.5, -0.25], requires_grad=True)
    layer = ae.linear_attention(k_mod=lambda x, b, h, t, d: x + table[h], layout="blhd")
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(Exception, match="gradients of the closure tensors a linear_attention mod reads"):
        torch.compile(lambda q: layer(q, q, q), backend="aot_eager", fullgraph=True)(q)


def test_linear_custom_op_passes_opcheck():
    from ae_mlir.frontend import linear_torch_op, varlen

    layer = ae.linear_attention(decay="token", k_mod=lambda x: x * 0.5)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 24, 16, generator=gen, requires_grad=True)
    g = (-torch.rand(1, 2, 24, generator=gen)).requires_grad_()
    kv = (2 * q.detach(), q.detach())
    torch.library.opcheck(linear_torch_op.linear_attention_op, (layer._key, "cpu", q, *kv, g, None, [], None, None, 0))
    cu = torch.tensor([0, 5, 5, 24], dtype=torch.int32)
    packed = varlen.prepare(q, q, cu, cu, None, None, False)
    torch.library.opcheck(linear_torch_op.linear_attention_op, (layer._key, "cpu", q, *kv, g, None, [], packed.kv_len,
                                                                packed.cu_q, packed.longest_q))


def test_linear_attention_constructed_inside_torch_compile_is_refused():
    def make_and_call(q):
        return ae.linear_attention()(q, q, q)

    with pytest.raises(Exception, match="cannot be constructed inside a torch.compile'd function"):
        torch.compile(make_and_call, backend="aot_eager", fullgraph=True)(torch.randn(1, 2, 8, 16))

"""Numerics of the float64 reference executor for linear attention against a closed form computed
here in float64 from plain PyTorch (nothing from ae_mlir builds the expected values)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import ae_mlir as ae
from inputs import rand
from test_reference import check


LB, LH, LL, LDK, LDV = 2, 3, 17, 12, 10


def lin_inputs(dtype=torch.float32, seed=100, positive=False):
    q, k = rand(LB, LH, LL, LDK, seed=seed), rand(LB, LH, LL, LDK, seed=seed + 1)
    if positive:  # keeps normalize=True denominators away from zero
        q, k = torch.sigmoid(q) + 0.1, torch.sigmoid(k) + 0.1
    v = rand(LB, LH, LL, LDV, seed=seed + 2)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def log_decay(decay, seed, b=LB, h=LH, l=LL, dk=LDK):
    shape = {"head": (h,), "token": (b, h, l), "token_dim": (b, h, l, dk)}[decay]
    return F.logsigmoid(rand(*shape, seed=seed) + 2.0)  # negative, decays in (0.5, 1)


def cumulative(decay, g, b, h, l, dk):
    """G[b, h, t, d] = sum_{s<=t} g, float64."""
    if decay is None:
        return torch.zeros(b, h, l, dk, dtype=torch.float64)
    g = g.double()
    if decay == "head":
        return (torch.arange(1, l + 1, dtype=torch.float64).view(1, 1, l, 1) * g.view(1, h, 1, 1)).expand(b, h, l, dk)
    if decay == "token":
        return g.cumsum(dim=2).unsqueeze(-1).expand(b, h, l, dk)
    return g.cumsum(dim=2)


def expected_linear(q, k, v, G, s0=None, scale=None, normalize=False):
    """Closed form: o_t = scale * (sum_{s<=t} sum_d q_t k_s exp(G_t - G_s) v_s + (q_t e^{G_t}) S_0)."""
    q, k, v = q.double(), k.double(), v.double()
    l, dk = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    decay = torch.exp(G.unsqueeze(3) - G.unsqueeze(2))  # [b, h, t, s, d]
    a = torch.einsum("bhtd,bhsd,bhtsd->bhts", q, k, decay)
    a = a * torch.tril(torch.ones(l, l, dtype=torch.float64))
    num = a @ v
    if s0 is not None:
        num = num + torch.einsum("bhtd,bhde->bhte", q * torch.exp(G), s0.double())
    if normalize:
        o = num / a.sum(dim=-1, keepdim=True)
    else:
        o = scale * num
    GL = G[:, :, -1:, :]
    state = torch.einsum("bhsd,bhse->bhde", k * torch.exp(GL - G), v)
    if s0 is not None:
        state = state + torch.exp(GL[:, :, 0, :]).unsqueeze(-1) * s0.double()
    return o, state


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
@pytest.mark.parametrize("with_s0", [False, True])
def test_linear_decays_closed_form(decay, with_s0):
    q, k, v = lin_inputs(seed=101)
    g = None if decay is None else log_decay(decay, seed=102)
    s0 = rand(LB, LH, LDK, LDV, seed=103) if with_s0 else None
    lin = ae.linear_attention(decay=decay)
    o, state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    assert o.shape == (LB, LH, LL, LDV) and state.shape == (LB, LH, LDK, LDV)
    assert state.dtype == torch.float32
    G = cumulative(decay, g, LB, LH, LL, LDK)
    want_o, want_state = expected_linear(q, k, v, G, s0)
    check(o, want_o)
    check(state, want_state)


def test_linear_return_state_false_returns_output_only():
    q, k, v = lin_inputs(seed=104)
    o = ae.linear_attention()(q, k, v, backend="reference")
    assert isinstance(o, torch.Tensor)
    check(o, expected_linear(q, k, v, cumulative(None, None, LB, LH, LL, LDK))[0])


def test_linear_custom_scale():
    q, k, v = lin_inputs(seed=105)
    g = log_decay("token", seed=106)
    o = ae.linear_attention(decay="token", scale=0.7)(q, k, v, g, backend="reference")
    check(o, expected_linear(q, k, v, cumulative("token", g, LB, LH, LL, LDK), scale=0.7)[0])


@pytest.mark.parametrize("decay", [None, "token_dim"])
def test_linear_normalize(decay):
    q, k, v = lin_inputs(seed=107, positive=True)
    g = None if decay is None else log_decay(decay, seed=108)
    o = ae.linear_attention(decay=decay, normalize=True, scale=0.5)(q, k, v, g, backend="reference")
    G = cumulative(decay, g, LB, LH, LL, LDK)
    check(o, expected_linear(q, k, v, G, normalize=True)[0])


def test_linear_elu_feature_map_via_where():
    def elu1(x, b, h, t, d):
        return torch.where(x > 0, x + 1, torch.exp(x))

    q, k, v = lin_inputs(seed=109)
    o = ae.linear_attention(q_mod=elu1, k_mod=elu1, normalize=True)(q, k, v, backend="reference")
    fq, fk = F.elu(q.double()) + 1, F.elu(k.double()) + 1
    check(o, expected_linear(fq, fk, v, cumulative(None, None, LB, LH, LL, LDK), normalize=True)[0])


def test_linear_mamba2_style_dt():
    dt = F.softplus(rand(LB, LH, LL, seed=110))
    a_log = rand(LH, seed=111)

    def v_times_dt(x, b, h, t, d):
        return x * dt[b, h, t]

    # Mamba2: g_t = -exp(A_log[h]) * dt_t per token, v scaled by dt
    g = (-torch.exp(a_log).view(1, LH, 1) * dt).float()
    q, k, v = lin_inputs(seed=112)
    lin = ae.linear_attention(v_mod=v_times_dt, decay="token", scale=1.0)
    o, state = lin(q, k, v, g, return_state=True, backend="reference")
    G = cumulative("token", g, LB, LH, LL, LDK)
    want_o, want_state = expected_linear(q, k, v.double() * dt.double().unsqueeze(-1), G, scale=1.0)
    check(o, want_o)
    check(state, want_state)


def test_linear_mods_see_indices():
    # q_mod uses t and d; k_mod uses b and h: each index must bind to the right axis
    w = rand(LDK, seed=113)

    def q_mod(x, b, h, t, d):
        return x * w[d] + t * 0.01

    def k_mod(x, b, h, t, d):
        return x + b - h * 0.5

    q, k, v = lin_inputs(seed=114)
    o = ae.linear_attention(q_mod=q_mod, k_mod=k_mod)(q, k, v, backend="reference")
    tq = torch.arange(LL).view(1, 1, -1, 1) * 0.01
    fq = q.double() * w.double() + tq
    fk = k.double() + torch.arange(LB).view(-1, 1, 1, 1) - torch.arange(LH).view(1, -1, 1, 1) * 0.5
    check(o, expected_linear(fq, fk, v, cumulative(None, None, LB, LH, LL, LDK))[0])


@pytest.mark.parametrize("decay", ["head", "token", "token_dim"])
def test_linear_state_carry_equals_one_run(decay):
    q, k, v = lin_inputs(seed=115)
    g = log_decay(decay, seed=116)
    lin = ae.linear_attention(decay=decay)
    o_full, s_full = lin(q, k, v, g, return_state=True, backend="reference")
    cut = 9  # halves of unequal length (9 + 8)
    if decay == "head":
        g1 = g2 = g
    else:
        g1, g2 = g[:, :, :cut], g[:, :, cut:]
    o1, s1 = lin(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], g1, return_state=True, backend="reference")
    o2, s2 = lin(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], g2, initial_state=s1, return_state=True,
                 backend="reference")
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s2, s_full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_low_precision(dtype):
    q, k, v = lin_inputs(dtype=dtype, seed=117)
    g = log_decay("token", seed=118)  # f32 log-decay alongside low-precision q/k/v
    o, state = ae.linear_attention(decay="token")(q, k, v, g, return_state=True, backend="reference")
    want_o, want_state = expected_linear(q, k, v, cumulative("token", g, LB, LH, LL, LDK))
    check(o, want_o, dtype)
    check(state, want_state)

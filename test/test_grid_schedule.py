"""core/grid_schedule.py: the wave fill and the causal grids' load model the presets choose the
Gluon forward's schedule by (launch_defaults.warp_specialized, gluon_schedule), on cases small
enough to work out by hand."""
from __future__ import annotations

import pytest

from ae_mlir import launch_defaults
from ae_mlir.core import grid_schedule as gs


def test_the_presets_know_the_gluon_kernels_rows():
    from ae_mlir.passes.gluon.attention_forward import block_m

    assert all(launch_defaults._GLUON_ROWS[dim] == block_m(dim) for dim in (64, 128))


def test_section_heads_is_the_least_power_of_two_that_fills_the_wave():
    assert [gs.section_heads(132, blocks, 1024) for blocks in (200, 132, 64, 16, 1)] == [1, 1, 4, 16, 256]


def test_wave_fill():
    assert gs.wave_fill(132, 132) == 1.0 and gs.wave_fill(176, 132) == pytest.approx(176 / 264)
    assert gs.wave_fill(66, 132) == 0.5


def test_makespans_worked_by_hand():
    # 1 head of 4 causal blocks (4, 3, 2, 1 tiles) on 2 multiprocessors: both grids pair 4 + 1, 3 + 2.
    assert gs.per_block_makespan(1, 4, 2) == 5 and gs.persistent_makespan(1, 4, 2) == 5
    # 2 heads of 3 blocks on 4: the persistent grid's fixed rounds give program 3 the items
    # (head 1, block 2) and (head 0, block 1), 3 + 2 tiles; the per-block grid, in a section of 2
    # heads (3, 3, 2, 2, 1, 1), ends at 3.
    assert gs.persistent_makespan(2, 3, 4) == 5 and gs.per_block_makespan(2, 3, 4) == 3


@pytest.mark.parametrize("batch_heads, length, persistent", [
    (16, 8192, False), (12, 8192, False), (8, 4096, False), (4, 8192, False), (16, 4096, False),
    (128, 2048, True), (32, 8192, True), (32, 2048, True), (32, 1024, True), (8, 2048, True),
])
def test_causal_schedule_follows_the_h100_shapes(batch_heads, length, persistent):
    """The choice the model makes at D = 128 is the faster grid in
    bench/results/h100-gluon-shapes-2026-12-06-sections.json (and, at 32 x 8192, the
    warp_specialized runs)."""
    assert launch_defaults.gluon_schedule(132, True, length, 128, batch_heads)["persistent"] is persistent
    assert launch_defaults.gluon_schedule(132, False, length, 128, batch_heads)["persistent"]


@pytest.mark.parametrize("batch_heads, length, gluon", [
    (8, 4096, False), (4, 8192, False), (32, 1024, False), (16, 4096, False), (16, 8192, False),
    (12, 8192, True), (128, 2048, True), (32, 8192, True),
])
def test_full_d64_takes_the_gluon_kernel_where_its_waves_fill(batch_heads, length, gluon):
    assert launch_defaults.warp_specialized("cuda:90", "none", length, 64, batch_heads=batch_heads) is gluon
    # D = 128's programs are the Triton IR kernel's size: the Gluon kernel wherever it lowers.
    assert launch_defaults.warp_specialized("cuda:90", "none", length, 128, batch_heads=batch_heads)


@pytest.mark.parametrize("batch_heads, length, gluon", [
    (32, 8192, True), (16, 16384, True), (128, 2048, False), (32, 4096, False), (16, 8192, False), (0, 8192, False),
])
def test_causal_d64_takes_the_gluon_kernel_on_long_deep_grids(batch_heads, length, gluon):
    """On an H100 a program per block of the Gluon kernel ran 1.06x the Triton IR kernel at B 2
    H 16 L 8192 and 0.93x at B 8 H 16 L 2048 (h100-forward-ab-2026-12-07-causal-d64.json)."""
    assert launch_defaults.warp_specialized("cuda:90", "causal", length, 64, batch_heads=batch_heads) is gluon
    assert not launch_defaults.warp_specialized("cuda:90", "causal", length, 64, batch_heads=batch_heads,
                                                backward=True)
    assert not launch_defaults.gluon_schedule(132, True, length, 64, batch_heads or 1)["persistent"]

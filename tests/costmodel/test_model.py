import math

import pytest

from kvtier.costmodel.hardware import CopyMechanism, get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.operators import Shapes, gemm, step_ops, totals
from kvtier.costmodel.shape import StepShape
from tests.costmodel.synthetic import HOST, _t, calibration, model_config

H200, A100 = get_hardware("h200"), get_hardware("a100-80gb")
BLOCK = 2 * 4 * 16 * 5120 * 2


def decode(b: int, ctx: int) -> StepShape:
    return StepShape(num_decodes=b, decode_ctx_sum=b * ctx, decode_ctx_max=ctx, num_sampled=b)


def model(hw=H200, calib=None, **kw) -> CostModel:
    return CostModel(model_config(), hw, calib, CostModelConfig(block_bytes=BLOCK, **kw))


def test_uncalibrated_decode_is_above_the_hbm_roofline_and_grows_with_context():
    cm = model()
    for b, ctx in ((1, 100), (32, 1000), (128, 2000)):
        shape = decode(b, ctx)
        _, byts = totals(step_ops(Shapes.of(model_config()), shape, cm.graph_batch(shape)))
        t = cm.predict(shape).executor_s
        assert t > byts / H200.hbm_bytes_per_s
        assert cm.predict(decode(b, 2 * ctx)).executor_s > t


def test_graph_padding_and_eager_fallback():
    cm = model(max_num_seqs=256)
    assert cm.graph_batch(decode(17, 100)) == 24
    assert cm.graph_batch(decode(256, 100)) == 256
    mixed = StepShape(num_decodes=3, decode_ctx_sum=300, decode_ctx_max=100,
                      prefills=((50, 0),), num_sampled=4)
    assert cm.graph_batch(mixed) is None and not cm.predict(mixed).graph
    assert model(cuda_graphs=False).graph_batch(decode(8, 100)) is None


def test_calibrated_graph_step_is_host_plus_measured_operators():
    """A decode step of 16 at the padded size 16: exactly the synthetic curves + host."""
    cm = model(calib=calibration())
    s = Shapes.of(model_config())
    dims = s.gemm_dims()
    shape = decode(16, 512)
    layer = sum(_t(gemm(n, 16, *dims[n], 2)) for n in ("qkv", "o", "gate_up", "down"))
    layer += calibration().elementwise.at(16) + calibration().attn_decode_graph.at(16, 512)
    head = calibration().head_elementwise.at(16) + _t(gemm("lm_head", 16, *dims["lm_head"], 2))
    expect = (HOST.graph_s + 16 * HOST.graph_s_per_req + 40 * layer + head
              + calibration().sample.at(16))
    assert math.isclose(cm.predict(shape).executor_s, expect, rel_tol=1e-9)


def test_transfer_to_the_a100_scales_bandwidth_bound_operators_by_bandwidth():
    calib = calibration()
    h, a = model(H200, calib), model(A100, calib)
    s = Shapes.of(model_config())
    op = gemm("qkv", 1, *s.gemm_dims()["qkv"], 2)  # a decode GEMM: weight-bound
    ratio = a.timer.keyed(op, 1) / h.timer.keyed(op, 1)
    assert math.isclose(ratio, H200.hbm_bytes_per_s / A100.hbm_bytes_per_s, rel_tol=1e-9)
    big = gemm("gate_up", 8192, *s.gemm_dims()["gate_up"], 2)  # compute-bound
    ratio = a.timer.keyed(big, 8192) / h.timer.keyed(big, 8192)
    assert math.isclose(ratio, H200.bf16_flops / A100.bf16_flops, rel_tol=1e-9)


def test_swap_copies_cost_alpha_bytes_plus_beta():
    cm = model(calib=calibration())
    base = cm.predict(decode(8, 100)).executor_s
    swapped = cm.predict(StepShape(8, 800, 100, (), 8, num_swap_out=10, num_swap_in=4))
    expect = (30e-6 + 10 * BLOCK / 20e9) + (20e-6 + 4 * BLOCK / 25e9)
    assert math.isclose(swapped.executor_s - base, expect, rel_tol=1e-9)
    assert swapped.parts["copies"] == pytest.approx(expect)


def test_tensor_parallel_splits_gemms_and_adds_allreduces():
    one, two = model(), model(num_gpus=2)
    shape = StepShape(num_decodes=0, prefills=((2048, 0),), num_sampled=1)
    t1, t2 = one.predict(shape).executor_s, two.predict(shape).executor_s
    assert 0.5 * t1 < t2 < 0.8 * t1
    layer2 = two.layer_kernels(shape, 2048, graph=False)
    assert len(layer2) == len(one.layer_kernels(shape, 2048, graph=False)) + 2


def test_empty_step_costs_only_the_loop():
    cm = model(calib=calibration())
    cost = cm.predict(StepShape())
    assert cost.executor_s == 0 and cost.loop_s == pytest.approx(150e-6)


def test_calibration_of_another_model_is_refused():
    from kvtier.model.loader import resolve_model_config

    with pytest.raises(ValueError):
        CostModel(resolve_model_config("llama-3.1-8b", "dummy")[0], H200, calibration())


def test_measured_swap_curve_beats_the_affine_summary_when_present():
    from dataclasses import replace

    from kvtier.costmodel.curves import Curve

    calib = replace(calibration(), copy_out_blocks=Curve.from_points([(1, 1e-3), (64, 64e-3)]),
                    copy_in_blocks=Curve.from_points([(1, 0.5e-3), (64, 16e-3)]))
    cm = model(calib=calib)
    t = cm.copy_seconds(StepShape(num_swap_out=128, num_swap_in=64))
    assert t == pytest.approx(128e-3 + 16e-3)
    # Simulated on another GPU the measured curve does not apply: the link's bulk copy does.
    a = model(A100, calib)
    t = a.copy_seconds(StepShape(num_swap_out=10))
    assert t == pytest.approx(A100.d2h[CopyMechanism.BULK].seconds(10 * BLOCK))


def test_swap_overlap_prices_the_bubble_and_leaves_the_full_graph():
    # Decode steps bringing requests back: with overlap and piecewise graphs the runner
    # replays the pieces and waits per layer group; the copies cost only the bubble.
    shape = StepShape(num_decodes=64, decode_ctx_sum=64 * 1000, decode_ctx_max=1000,
                      num_sampled=64, num_swap_in=400)
    serial = model(piecewise_graphs=True)
    over = model(piecewise_graphs=True, overlap_swap=True, layers_per_block=4)
    assert serial.graph_batch(shape) == 64 and over.graph_batch(shape) is None
    s, o = serial.predict(shape), over.predict(shape)
    assert s.graph and s.parts["copies"] == serial.copy_seconds(shape)
    assert o.piecewise and not o.graph
    copy_in = over.copy_parts(shape)[1]
    fwd = o.parts["forward"]
    groups = over.group_layers()
    assert groups == [4] * 10  # 40 layers, F = 4
    # Group 0's tenth of the copies is exposed at least; the rest hides or exceeds compute.
    expect = max(copy_in / 10, copy_in + fwd / 10 - fwd)
    assert math.isclose(o.parts["copies"], expect, rel_tol=1e-9)
    assert o.parts["copies"] < s.parts["copies"]
    # Without piecewise graphs the full graph replays after all copies: serial pricing.
    g = model(overlap_swap=True, layers_per_block=4).predict(shape)
    assert g.graph and g.parts["copies"] == serial.copy_seconds(shape)
    # Copy-only steps and steps without copies are unchanged.
    assert over.predict(StepShape(num_swap_in=10)).executor_s == \
        serial.predict(StepShape(num_swap_in=10)).executor_s

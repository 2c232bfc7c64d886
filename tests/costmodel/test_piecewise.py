"""Pricing steps with prefill rows under piecewise CUDA graphs (kvtier/runner/piecewise_graphs.py):
GEMMs and elementwise kernels at the padded token count, attention at the real shapes, per
layer the attention's launches + one copy + one graph replay (L + 1 replays a step), all
through the launch queue; eager pricing unchanged when the flag is off."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.core.graph_sizes import graph_batch_sizes, piecewise_sizes
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.operators import (
    ELEMENTWISE_KERNELS,
    Shapes,
    attn_out_copy,
    attn_prefill,
    gemm,
    layer_elementwise,
    piece_copies,
)
from kvtier.costmodel.overlap import (
    forward_seconds,
    queue_seconds,
    queue_seconds_brute,
)
from kvtier.costmodel.shape import StepShape
from kvtier.profiler.fit import fit_calibration, launch_params
from tests.costmodel.synthetic import HOST, calibration, model_config, raw_measurements

H200 = get_hardware("h200")
BLOCK = 2 * 4 * 16 * 5120 * 2
L = 40  # llama-2-13b
# 3 decodes (contexts 400, 500, 600) + a 527-token prompt chunk after 100 cached: T = 530
MIXED = StepShape(num_decodes=3, decode_ctx_sum=1500, decode_ctx_max=600,
                  prefills=((527, 100),), num_sampled=4)


def model(piecewise=True, calib=None, **kw) -> CostModel:
    return CostModel(model_config(), H200, calib if calib is not None else calibration(),
                     CostModelConfig(block_bytes=BLOCK, piecewise_graphs=piecewise,
                                     max_num_batched_tokens=8192, **kw))


def test_padded_sizes_and_which_steps_are_piecewise():
    cm = model()
    assert piecewise_sizes(8192)[:3] == [32, 64, 96] and 512 in piecewise_sizes(8192)
    assert cm.piecewise_size(MIXED) == 544  # 512, then every 32 up to 1024
    assert cm.piecewise_size(StepShape(prefills=((33, 0),), num_sampled=1)) == 64
    assert cm.piecewise_size(StepShape(prefills=((8192, 0),), num_sampled=1)) == 8192
    assert cm.piecewise_size(StepShape(prefills=((8193, 0),), num_sampled=1)) is None
    cost = cm.predict(MIXED)
    assert cost.piecewise and not cost.graph
    # A graph-eligible decode step still replays its decode graph.
    dec = StepShape(num_decodes=8, decode_ctx_sum=800, decode_ctx_max=100, num_sampled=8)
    assert cm.predict(dec).graph and not cm.predict(dec).piecewise
    # The runner's rule: no pieces without CUDA graphs (enforce_eager, HCache), none when off.
    assert model(cuda_graphs=False).piecewise_size(MIXED) is None
    assert model(piecewise=False).piecewise_size(MIXED) is None
    assert not model(piecewise=False).predict(MIXED).piecewise


def hand_launches(shape: StepShape, t: int, host=HOST):
    """The launches of a piecewise step, built from the synthetic curves by hand."""
    c, s = calibration(), Shapes.of(model_config())
    dims = s.gemm_dims()
    n = shape.num_tokens
    g = {k: c.gemm[k].at(t) for k in ("qkv", "o", "gate_up", "down")}
    ew = c.elementwise.at(t)
    cb, ca = piece_copies(s, t)
    before = g["qkv"] + 0.5 * ew + copy_seconds(cb, t)
    after = g["o"] + g["gate_up"] + g["down"] + 0.5 * ew + copy_seconds(ca, t)
    dec = c.attn_decode_eager.at(shape.num_decodes, shape.decode_ctx_sum / shape.num_decodes)
    op = attn_prefill(s, shape.prefills)
    pre_attn = c.attn_prefill.seconds(op.flops, shape.num_prefill_tokens)
    attn = [(host.attn_write_s, 0.0), (host.attn_decode_s, dec), (host.attn_prefill_s, pre_attn),
            (host.op_launch_s, copy_seconds(attn_out_copy(s, n), n))]
    head = c.head_elementwise.at(n)
    lm = c.gemm["lm_head"].at(shape.num_sampled)
    assert lm == pytest.approx(H200.roofline_s(*_fb(gemm("lm_head", shape.num_sampled,
                                                           *dims["lm_head"], 2))) / 0.8 + 3e-6,
                               rel=0.05)
    pre = [(3 * host.op_launch_s, head), (host.replay_s, before)]
    replay = host.replay_s + host.piece_layer_s
    layer = [*attn, (replay, after + before)]
    # The last layer past its attention: the sampled rows (padded to a decode graph size)
    # gathered, then the last piece at their padded count.
    kept = next(b for b in graph_batch_sizes(256) if b >= shape.num_sampled)
    kt = next(size for size in piecewise_sizes(8192) if size >= kept)
    gather = copy_seconds(piece_copies(s, kept)[1], kept)
    after_kept = (sum(c.gemm[k].at(kt) for k in ("o", "gate_up", "down"))
                  + 0.5 * c.elementwise.at(kt) + copy_seconds(piece_copies(s, kt)[1], kt))
    last = [*attn, (4 * host.op_launch_s, gather), (replay, after_kept)]
    post = [(host.launch_s, 0.0), (host.launch_s, lm)]
    return pre, layer, last, post


def copy_seconds(op, rows: int) -> float:
    """A copy into a static buffer, priced like the layer's measured elementwise kernels: their
    per-kernel floor (time at one token over 4 kernels) per launch, bytes at their bandwidth."""
    c, s = calibration(), Shapes.of(model_config())
    ew_bytes = layer_elementwise(s, rows).bytes
    return op.launches * c.elementwise.at(1) / 4 + op.bytes * c.elementwise.at(rows) / ew_bytes


def _fb(op):
    return op.flops, op.bytes


def test_copies_priced_at_the_measured_elementwise_bandwidth():
    cm, s = model(), Shapes.of(model_config())
    _, ca = piece_copies(s, 2080)  # hidden and residual: 2 launches, 4 x 2080 x 5120 x 2 bytes
    ew = calibration().elementwise
    bytes_per_s = layer_elementwise(s, 2080).bytes / ew.at(2080)
    expect = 2 * ew.at(1) / 4 + ca.bytes / bytes_per_s
    assert cm.timer.keyed(ca, 2080) == pytest.approx(expect, rel=1e-12)
    assert ca.bytes == 4 * 2080 * 5120 * 2
    # Without a calibration: the roofline at the default efficiency, plus a floor a launch.
    bare = CostModel(model_config(), H200, None, CostModelConfig(piecewise_graphs=True))
    roof = H200.roofline_s(0.0, ca.bytes) / 0.6 + 2 * 3e-6
    assert bare.timer.keyed(ca, 2080) == pytest.approx(roof, rel=1e-12)


def test_mixed_step_gemms_at_the_padded_count_attention_at_the_real_shapes():
    cm = model()
    pre, layer, last, post = hand_launches(MIXED, 544)
    fwd = queue_seconds_brute(layer, L - 1, pre, [*last, *post])
    host = HOST.eager_s + HOST.eager_s_per_req * 4 + HOST.eager_s_per_token * 530
    cost = cm.predict(MIXED)
    assert cost.parts["forward"] == pytest.approx(fwd, rel=1e-12)
    assert cost.parts["host"] == pytest.approx(host, rel=1e-12)
    assert cost.executor_s == pytest.approx(host + fwd + calibration().sample.at(4), rel=1e-12)
    # Priced at 530 rows instead, the GEMMs would cost less: the padding is in the price.
    c = calibration()
    assert c.gemm["gate_up"].at(544) > c.gemm["gate_up"].at(530)
    assert cm.piece_kernels(544)[1] > cm.piece_kernels(530)[1]


def test_l_plus_one_replays_and_the_host_chain():
    cm = model()
    h = HOST
    per_layer = h.attn_write_s + h.attn_decode_s + h.attn_prefill_s + h.op_launch_s
    gather = 4 * h.op_launch_s  # the last layer's kept rows: two index_selects, two copies
    expect = 3 * h.op_launch_s + (L + 1) * h.replay_s + L * per_layer + gather + 2 * h.launch_s
    assert cm.piecewise_issue_seconds(MIXED, 544) == pytest.approx(expect, rel=1e-12)
    # Prefill only: no decode wrapper.
    pre = StepShape(prefills=((300, 0),), num_sampled=1)
    expect = (3 * h.op_launch_s + (L + 1) * h.replay_s
              + L * (h.attn_write_s + h.attn_prefill_s + h.op_launch_s) + gather
              + 2 * h.launch_s)
    assert cm.piecewise_issue_seconds(pre, 320) == pytest.approx(expect, rel=1e-12)
    # Host-bound (a replay costs 1-2 ms, far above a piece's GPU time): each extra ms of
    # replay cost is paid exactly L + 1 times.
    slow = [model(calib=replace(calibration(), host=replace(HOST, replay_s=r)))
            for r in (1e-3, 2e-3)]
    small = StepShape(num_decodes=2, decode_ctx_sum=200, decode_ctx_max=100,
                      prefills=((20, 0),), num_sampled=3)
    d = slow[1].predict(small).executor_s - slow[0].predict(small).executor_s
    assert d == pytest.approx((L + 1) * 1e-3, rel=1e-9)


def test_piecewise_beats_eager_when_the_host_binds():
    """A small mixed step: eager issues ~14 launches a layer, pieces ~5."""
    small = StepShape(num_decodes=3, decode_ctx_sum=900, decode_ctx_max=300,
                      prefills=((24, 0),), num_sampled=4)
    calib = replace(calibration(), host=replace(HOST, launch_s=45e-6))
    assert model(calib=calib).predict(small).executor_s < \
        0.6 * model(piecewise=False, calib=calib).predict(small).executor_s


@pytest.mark.parametrize("kw", [dict(piecewise=False), dict(piecewise=True, cuda_graphs=False)])
def test_eager_pricing_is_unchanged_when_pieces_are_off(kw):
    cm = model(**kw)
    c = calibration()
    t = MIXED.num_tokens
    layer = cm.layer_kernels(MIXED, t, graph=False)
    head = cm.head_kernels(t, MIXED.num_sampled)
    # The last layer past its attention (o, norm, gate_up, silu*up, down) at the 4 sampled
    # rows only.
    ew4 = c.elementwise.at(4) / ELEMENTWISE_KERNELS
    after = [c.gemm["o"].at(4), ew4, c.gemm["gate_up"].at(4), ew4, c.gemm["down"].at(4)]
    fwd = forward_seconds(layer, L - 1, HOST.launch_s, head[:1],
                          [*layer[:-5], *after, *head[1:]])
    host = HOST.eager_s + HOST.eager_s_per_req * 4 + HOST.eager_s_per_token * t
    cost = cm.predict(MIXED)
    assert not cost.piecewise and cost.parts == {"copies": 0.0, "host": host, "forward": fwd,
                                                 "sample": c.sample.at(4)}
    # ... which is at the real token count: the elementwise kernels' time at 530, not 544
    ew = c.elementwise.at(530) / ELEMENTWISE_KERNELS
    assert layer[0] == pytest.approx(ew, rel=1e-12)


def test_too_large_a_step_falls_back_to_eager():
    cm = CostModel(model_config(), H200, calibration(),
                   CostModelConfig(block_bytes=BLOCK, piecewise_graphs=True,
                                   max_num_batched_tokens=512))
    big = StepShape(prefills=((600, 0),), num_sampled=1)
    assert cm.piecewise_size(big) is None and not cm.predict(big).piecewise


times = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)
launches = st.lists(st.tuples(st.floats(0.0, 2e-4), times), max_size=8)


@settings(max_examples=300, deadline=None)
@given(layer=launches, layers=st.integers(0, 90), pre=launches, post=launches)
def test_queue_closed_form_matches_launch_by_launch(layer, layers, pre, post):
    fast = queue_seconds(layer, layers, pre, post)
    slow = queue_seconds_brute(layer, layers, pre, post)
    assert abs(fast - slow) <= 1e-12 + 1e-9 * slow


def test_queue_with_equal_launches_is_the_eager_forward():
    kernels, pre, post = [5e-6, 40e-6, 1e-6, 2e-6], [3e-6], [1e-6, 30e-6]
    c = 8e-6
    a = forward_seconds(kernels, 32, c, pre, post)
    b = queue_seconds([(c, g) for g in kernels], 32, [(c, g) for g in pre],
                      [(c, g) for g in post])
    assert math.isclose(a, b, rel_tol=1e-12)


# ---- calibration -----------------------------------------------------------------------------
def test_launch_params_solve_the_attention_wrappers():
    p = launch_params({"attn_decode_s": 140e-6, "attn_prefill_s": 90e-6,
                       "attn_mixed_s": 186e-6, "op_s": 9e-6, "replay_s": 12e-6})
    assert p == pytest.approx({"attn_write_s": 44e-6, "attn_decode_s": 96e-6,
                               "attn_prefill_s": 46e-6, "op_launch_s": 9e-6, "replay_s": 12e-6})
    assert launch_params({"op_s": 9e-6}) == {"op_launch_s": 9e-6}
    assert launch_params(None) == {}


PIECES = dict(attn_write_s=40e-6, attn_decode_s=90e-6, attn_prefill_s=50e-6, op_launch_s=9e-6,
              replay_s=14e-6)


def piecewise_steps() -> list[dict]:
    """Steps of an engine with piecewise graphs on, timed by the synthetic calibration with
    HOST and the PIECES launch costs."""
    cm = model(calib=replace(calibration(), host=replace(HOST, **PIECES)))
    shapes = [StepShape(b, b * 300, 300, (), b) for b in (1, 8, 30, 64, 128, 256)]
    shapes += [StepShape(b, b * 500, 500, tuple((n, 0) for n in pre), b + len(pre))
               for b in (0, 5, 40, 120) for pre in ((30,), (400,), (1000, 200))]
    out = []
    for sh in shapes:
        row = {"shape": sh.to_json(), "wall_s": cm.predict(sh).executor_s, "issue_s": None}
        t = cm.piecewise_size(sh)
        if t is not None:  # the profiler times the eager forward's issue too
            n = L * len(cm.layer_kernels(sh, sh.num_tokens, False)) + 2
            row["issue_s"] = HOST.launch_s * n
            row["issue_piecewise_s"] = cm.piecewise_issue_seconds(sh, t)
        out.append(row)
    return out


def test_fit_with_piecewise_graphs_on():
    steps = piecewise_steps()
    raw = raw_measurements(steps)
    raw["meta"]["piecewise_graphs"] = True
    raw["host_launches"] = {"attn_decode_s": 130e-6, "attn_prefill_s": 90e-6,
                            "attn_mixed_s": 180e-6, "op_s": 9e-6, "replay_s": 14e-6}
    serving = [{"shape": st["shape"], "wall_s": st["wall_s"]} for st in steps]  # walls only
    calib = fit_calibration(dict(raw, serving_steps=serving))
    h = calib.host
    assert (h.attn_write_s, h.attn_decode_s, h.attn_prefill_s, h.op_launch_s, h.replay_s) == \
        pytest.approx(tuple(PIECES.values()))
    assert h.eager_s == pytest.approx(HOST.eager_s, rel=1e-3)
    assert h.graph_s == pytest.approx(HOST.graph_s, rel=1e-3)
    rep = calib.fit_report["steps"]
    assert rep["step_mape_piecewise"] < 1e-6 and rep["step_mape_eager"] is None
    assert rep["launch_from"] == "given"  # no eager step to search launch_s on: the sweep's
    assert h.launch_s == pytest.approx(HOST.launch_s, rel=1e-9)  # eager issue times give it
    check = calib.fit_report["sweep_steps_check"]
    assert check["piecewise_issue_steps"] == 12 and check["piecewise_issue_mape"] < 1e-9


def test_piece_layer_host_time_from_measured_piecewise_issue_times():
    """What the separately timed launches leave unexplained of a piecewise forward's measured
    issue time is fitted per layer (the median over steps) and paid once a layer."""
    extra = 60e-6
    steps = piecewise_steps()
    for row in steps:
        if row.get("issue_piecewise_s"):
            row["issue_piecewise_s"] += L * extra
    raw = raw_measurements(steps)
    raw["meta"]["piecewise_graphs"] = True
    raw["host_launches"] = {"attn_decode_s": 130e-6, "attn_prefill_s": 90e-6,
                            "attn_mixed_s": 180e-6, "op_s": 9e-6, "replay_s": 14e-6}
    calib = fit_calibration(raw)
    assert calib.host.piece_layer_s == pytest.approx(extra, rel=1e-9)
    assert calib.fit_report["piece_layer_s"] == pytest.approx(extra, rel=1e-9)
    cm = model(calib=calib)
    bare = model(calib=replace(calib, host=replace(calib.host, piece_layer_s=0.0)))
    d = cm.piecewise_issue_seconds(MIXED, 544) - bare.piecewise_issue_seconds(MIXED, 544)
    assert d == pytest.approx(L * extra, rel=1e-9)
    # Without measured piecewise issue times the term stays 0 (the default).
    assert fit_calibration(raw_measurements(piecewise_steps()[:6])).host.piece_layer_s == 0.0

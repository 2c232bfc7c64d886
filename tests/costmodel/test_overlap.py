from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.costmodel.overlap import forward_seconds, forward_seconds_brute, layer_lag_params

times = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(kernels=st.lists(times, min_size=1, max_size=14), layers=st.integers(0, 90),
       launch=st.floats(1e-7, 5e-5), pre=st.lists(times, max_size=2),
       post=st.lists(times, max_size=3))
def test_closed_form_matches_kernel_by_kernel_queue(kernels, layers, launch, pre, post):
    fast = forward_seconds(kernels, layers, launch, pre, post)
    slow = forward_seconds_brute(kernels, layers, launch, pre, post)
    assert abs(fast - slow) <= 1e-12 + 1e-9 * slow


def test_host_bound_forward_takes_the_launches():
    # 10 kernels of 1 us each launched every 5 us: the GPU waits on the host.
    t = forward_seconds([1e-6] * 10, num_layers=4, launch_s=5e-6)
    assert abs(t - (40 * 5e-6 + 1e-6)) < 1e-12


def test_gpu_bound_forward_takes_the_kernels():
    # 100 us kernels launched every 5 us: only the first launch is exposed.
    t = forward_seconds([100e-6] * 10, num_layers=4, launch_s=5e-6)
    assert abs(t - (5e-6 + 40 * 100e-6)) < 1e-12


def test_in_between_a_gemm_hides_launches_then_short_kernels_wait():
    # Per layer: a 50 us GEMM then nine 1 us kernels, launched every 6 us. The host (60 us a
    # layer) is the bottleneck, but the GEMM's last launch-free stretch leaves the GPU 5 us
    # behind the last launch: 32 * 60 + 5 us, more than max(host, GPU) = 1920 us.
    t = forward_seconds([50e-6] + [1e-6] * 9, 32, 6e-6)
    assert abs(t - 1925e-6) < 1e-12


def test_lag_params_of_a_known_layer():
    delta, a = layer_lag_params([3.0, 1.0], launch_s=2.0)
    assert delta == 4.0 - 4.0
    assert a == max(1.0, 4.0 - 2.0)


# ---- swap copies overlapped per layer group -------------------------------------------------
def test_swap_overlap_on_hand_computed_numbers():
    # forward 10 ms over 4 groups of one layer (2.5 ms each); swap-outs 1 ms, swap-ins 8 ms
    # (2 ms a group): group g's copies done at 3, 5, 7, 9 ms. Layers: 3..5.5, 5.5..8,
    # 8..10.5, 10.5..13 ms, so the forward ends at 13 ms: a 3 ms bubble (serial: 19 ms).
    from kvtier.costmodel.overlap import swap_overlap_seconds

    end, bubble = swap_overlap_seconds(10.0, 1.0, 8.0, [1, 1, 1, 1])
    assert (end, bubble) == (13.0, 3.0)
    # Copies that outrun the compute: 20 ms of swap-ins, 5 ms a group, done at 5, 10, 15, 20:
    # the last group waits, 20 + 2.5 = 22.5 ms.
    assert swap_overlap_seconds(10.0, 0.0, 20.0, [1, 1, 1, 1]) == (22.5, 12.5)
    # Uneven groups (L=5, F=2: 2, 2, 1 layers, 2 ms a layer), 3 ms of swap-ins (1 a group):
    # only group 0's copy is exposed: 1 + 10 ms.
    assert swap_overlap_seconds(10.0, 0.0, 3.0, [2, 2, 1]) == (11.0, 1.0)
    # One group (F = L): nothing to overlap, copies then forward.
    assert swap_overlap_seconds(10.0, 1.0, 8.0, [4]) == (19.0, 9.0)

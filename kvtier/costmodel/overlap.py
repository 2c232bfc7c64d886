"""Time of an eager forward pass: the host issues kernels one by one while the GPU runs behind
(and `queue_seconds`: the same with launches of unequal host cost, e.g. piecewise graphs).

Kernel j is issued at host time (j+1)*c after the layer starts and runs on the GPU once it
is issued and the previous kernel is done. When kernels are longer than their launch cost
the GPU is the bottleneck and the host runs ahead; when they are shorter (small batches)
the GPU idles between kernels and the forward takes the host's time. Neither max(host, GPU)
nor their sum is right in between, so the queue is solved exactly.

Every layer issues the same k kernels (times g_0..g_{k-1}). With d the GPU's lag behind the
host at a layer's start, the lag at its end is

    f(d) = max(d + G - k*c, a),   G = sum g_j,   a = max_j (sum_{i>=j} g_i - (k-1-j)*c)

(the last kernel ends either behind the GPU's backlog, or behind the launch of some kernel j
plus everything from j on). Composing f n times gives the closed form used below, so a
forward of L layers costs O(k), not O(L*k).
"""

from __future__ import annotations

from collections.abc import Sequence


def _run(kernels: Sequence[float], launch_s: float, host: float, gpu: float) -> tuple[float, float]:
    for g in kernels:
        host += launch_s
        gpu = max(gpu, host) + g
    return host, gpu


def layer_lag_params(kernels: Sequence[float], launch_s: float) -> tuple[float, float]:
    """(delta = G - k*c, a) of f(d) = max(d + delta, a) for one layer."""
    k = len(kernels)
    a, tail = float("-inf"), 0.0
    for j in range(k - 1, -1, -1):
        tail += kernels[j]
        a = max(a, tail - (k - 1 - j) * launch_s)
    return sum(kernels) - k * launch_s, a


def lag_after(d0: float, n: int, delta: float, a: float) -> float:
    """f applied n >= 1 times to d0: max(d0 + n*delta, a + max(0, (n-1)*delta))."""
    return max(d0 + n * delta, a + max(0.0, (n - 1) * delta))


def forward_seconds(
    layer_kernels: Sequence[float],  # device seconds of one layer's kernels, in issue order
    num_layers: int,
    launch_s: float,
    pre_kernels: Sequence[float] = (),  # before the layers (embedding)
    post_kernels: Sequence[float] = (),  # after them (final norm, lm_head)
) -> float:
    """Seconds from the first launch until the last kernel is done."""
    host, gpu = _run(pre_kernels, launch_s, 0.0, 0.0)
    if num_layers > 0 and layer_kernels:
        delta, a = layer_lag_params(layer_kernels, launch_s)
        d = lag_after(gpu - host, num_layers, delta, a)
        host += num_layers * len(layer_kernels) * launch_s
        gpu = host + d
    host, gpu = _run(post_kernels, launch_s, host, gpu)
    return max(host, gpu)


def forward_seconds_brute(layer_kernels: Sequence[float], num_layers: int, launch_s: float,
                          pre_kernels: Sequence[float] = (),
                          post_kernels: Sequence[float] = ()) -> float:
    """The same by simulating every kernel (the test oracle)."""
    host, gpu = _run(pre_kernels, launch_s, 0.0, 0.0)
    for _ in range(num_layers):
        host, gpu = _run(layer_kernels, launch_s, host, gpu)
    host, gpu = _run(post_kernels, launch_s, host, gpu)
    return max(host, gpu)


# ---- launches of unequal host cost (piecewise CUDA graphs) -----------------------------------
# A launch is (host seconds to issue it, device seconds of its kernels): a Triton wrapper, a
# torch op, or a graph replay whose kernels run back to back. With c_j the issue cost of launch
# j, the lag map of a layer is the same with (k-1-j)*c replaced by sum_{i>j} c_i.
Launch = tuple[float, float]


def _run_launches(launches: Sequence[Launch], host: float, gpu: float) -> tuple[float, float]:
    for c, g in launches:
        host += c
        gpu = max(gpu, host) + g
    return host, gpu


def launch_lag_params(launches: Sequence[Launch]) -> tuple[float, float]:
    """(delta = G - C, a) of f(d) = max(d + delta, a) for one layer of launches."""
    a, tail, after = float("-inf"), 0.0, 0.0
    for c, g in reversed(launches):
        tail += g
        a = max(a, tail - after)
        after += c
    return tail - after, a


def queue_seconds(layer: Sequence[Launch], num_layers: int, pre: Sequence[Launch] = (),
                  post: Sequence[Launch] = ()) -> float:
    """Seconds from the first launch until the last kernel is done: `pre`, then `num_layers`
    copies of `layer`, then `post` (closed form over the layers, as `forward_seconds`)."""
    host, gpu = _run_launches(pre, 0.0, 0.0)
    if num_layers > 0 and layer:
        delta, a = launch_lag_params(layer)
        d = lag_after(gpu - host, num_layers, delta, a)
        host += num_layers * sum(c for c, _ in layer)
        gpu = host + d
    host, gpu = _run_launches(post, host, gpu)
    return max(host, gpu)


def queue_seconds_brute(layer: Sequence[Launch], num_layers: int, pre: Sequence[Launch] = (),
                        post: Sequence[Launch] = ()) -> float:
    """The same launch by launch (the test oracle)."""
    host, gpu = _run_launches(pre, 0.0, 0.0)
    for _ in range(num_layers):
        host, gpu = _run_launches(layer, host, gpu)
    host, gpu = _run_launches(post, host, gpu)
    return max(host, gpu)


# ---- swap copies overlapped with the forward, layer group by layer group ---------------------
# The runner (kvtier/runner/swap_copies.py) issues a step's swap-outs, then its swap-ins group
# by group, on a copy stream, and the forward waits for group g's copies just before group g's
# first attention. A request is swapped whole, with the same number of blocks in every group,
# so the swap-ins split evenly: group g's copies are done at
#     E_g = out + (g + 1) * in / G
# after the forward's first launch (the host work before it is not counted as overlap, as the
# serial pricing does not count it either). The forward's time is spread evenly over its layers,
# the wait put at the start of each group (its first layer's norm and qkv GEMM, before the
# attention, are a small part of a layer), so with n_g layers in group g and c = forward / L:
#     t_0 = 0,   t_{g+1} = max(t_g, E_g) + n_g * c,   bubble = t_G - forward.
# Group 0's copies (and every swap-out) are always exposed; later groups' hide behind the
# compute of the groups before them until the copies outrun it.
def swap_overlap_seconds(forward_s: float, copy_out_s: float, copy_in_s: float,
                         group_layers: Sequence[int],
                         top_copy_in: tuple[float, int] = (0.0, 0),
                         window: int = 0) -> tuple[float, float]:
    """(seconds from the forward's first launch until it ends, the bubble: how long it
    waited for copies), with `group_layers[g]` layers in layer group g. `copy_in_s` is
    spread evenly over the groups; `top_copy_in = (seconds, h)` more go to the top h groups
    alone (offloaded dropped prefixes), of which the j-th may start only once the (j -
    window)-th group's layers are done (`window` 0: all at once; the runner issues such a
    copy when that group's attention is issued, so this errs on the late side)."""
    num_layers, groups = sum(group_layers), len(group_layers)
    top_s, top_h = top_copy_in
    if not num_layers:
        return (forward_s + copy_out_s + copy_in_s + top_s,
                copy_out_s + copy_in_s + top_s)
    per_layer = forward_s / num_layers
    first_top = groups - top_h
    t, arrived = 0.0, copy_out_s
    ends: list[float] = []
    for g, n in enumerate(group_layers):
        arrived += copy_in_s / groups
        if top_h and g >= first_top:
            j = g - first_top
            if window and j >= window:
                arrived = max(arrived, ends[g - window])
            arrived += top_s / top_h
        t = max(t, arrived) + n * per_layer
        ends.append(t)
    return t, t - forward_s

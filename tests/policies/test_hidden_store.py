"""HCache's hidden-state store, and when it saves memory at all."""

import pytest

from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import preset_config
from kvtier.policies.hcache.store import HiddenStore


def test_store_covers_a_prefix_and_gives_up_when_full():
    store = HiddenStore(num_blocks=3, block_size=4)
    assert store.extend("a", 5) == (0, 1)
    assert store.extend("a", 8) == ()  # still inside block 1
    assert store.covers("a", 8) and not store.covers("a", 9)
    assert store.extend("b", 4) == (2,)
    assert store.extend("a", 9) == ()  # the pool is empty: a loses its coverage
    assert not store.covers("a", 1) and store.extend("a", 12) == ()
    assert store.pool.num_free == 2
    store.check_integrity()
    store.free("a")
    store.free("b")
    assert store.pool.num_free == 3


@pytest.mark.parametrize("model,ratio", [
    ("llama-2-13b", 0.5),   # MHA: h values per layer instead of 2h
    ("llama-2-70b", 4.0),   # GQA 8 of 64 heads: 8x smaller KV, hidden states 4x larger
    ("llama-3.1-8b", 2.0),  # GQA 8 of 32 heads
    ("qwen2.5-7b", 3.5),    # GQA 4 of 28 heads
])
def test_hidden_states_save_memory_only_for_mha(model, ratio):
    m = model_config_from_hf(preset_config(model))
    assert m.hidden_bytes_per_token(2) / m.kv_bytes_per_token(2) == pytest.approx(ratio)

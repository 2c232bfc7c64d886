"""HF tokenizer directories (with chat template), the offline BPE, sharded checkpoints."""

from __future__ import annotations

import json

import pytest

from kvtier import LLM, SamplingParams
from kvtier.config import ConfigError
from kvtier.model.hf_config import model_config_from_hf
from kvtier.tokenizer import BPETokenizer, HFTokenizer, load_tokenizer
from tests.hf_models import hf_greedy, save_tiny_model

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def save_hf_tokenizer(path, vocab_size=512, bos_first=False):
    """A byte-level BPE with a chat template; `bos_first`: it adds "<s>" before every text,
    as Llama's tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the KV cache lives in a memory hierarchy"] * 50, trainer)
    if bos_first:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)


def test_hf_tokenizer_dir_with_chat_template(tmp_path):
    save_hf_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path, None, 512)
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode("hello world")
    assert tok.decode(ids) == "hello world"
    chat = tok.decode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    assert chat == "[user]hi\n[assistant]"
    assert tok.eos_token_ids == (2,)


def test_add_special_tokens_false_leaves_out_what_the_tokenizer_adds(tmp_path):
    """transformers' flag: the BOS it adds around a text goes, a "<s>" written in it stays."""
    save_hf_tokenizer(tmp_path, bos_first=True)
    tok = load_tokenizer(tmp_path, None, 512)
    bos = tok.bos_token_id
    plain = tok.encode("hello world", add_special_tokens=False)
    assert tok.encode("hello world") == [bos, *plain] and bos not in plain
    assert tok.encode("<s>hello", add_special_tokens=False)[0] == bos


def test_model_dir_with_tokenizer_generates_text(tmp_path):
    save_tiny_model("llama-gqa", tmp_path)
    save_hf_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), max_model_len=128)
    out = llm.generate("hello world", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8
    assert out[0].outputs[0].text == llm.get_tokenizer().decode(out[0].outputs[0].token_ids)


def test_sharded_checkpoint_loads_exactly(tmp_path):
    import transformers

    save_tiny_model("qwen2", tmp_path / "one")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    prompts = [[3, 4, 5, 6]]
    want = hf_greedy(tmp_path / "one", prompts, 8)
    llm = LLM(str(tmp_path / "sharded"), dtype="float32", max_model_len=64)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in got] == want


def test_missing_weights_are_reported(tmp_path):
    save_tiny_model("llama-mha", tmp_path)
    from safetensors.torch import load_file, save_file

    f = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks weights"):
        LLM(str(tmp_path), max_model_len=64)


def test_missing_config_json(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no config.json"):
        LLM(str(tmp_path))


def test_offline_bpe_fits_small_vocab():
    tok = BPETokenizer(32000)
    ids = tok.encode("A memory hierarchy for the KV cache.")
    assert max(ids) < 32000 - 3
    assert tok.decode(ids) == "A memory hierarchy for the KV cache."
    assert all(e < 32000 for e in tok.eos_token_ids)


def test_llama3_rope_scaling_config_is_read(tmp_path):
    from kvtier.model.presets import preset_config

    cfg = model_config_from_hf(preset_config("llama-3.1-8b"))
    assert cfg.rope_scaling_dict["rope_type"] == "llama3"
    assert cfg.num_kv_heads == 8 and cfg.kv_bytes_per_token(2) == 128 * 1024
    (tmp_path / "config.json").write_text(json.dumps(preset_config("llama-2-13b")))
    assert model_config_from_hf(preset_config("llama-2-13b")).kv_bytes_per_token(2) == 800 * 1024


def _model_dir(tmp_path, name, **changes):
    from kvtier.model.presets import preset_config

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**preset_config("tiny-llama"), **changes}))
    return str(d)


def test_an_active_sliding_window_caps_max_model_len(tmp_path, caplog):
    from kvtier.engine.args import EngineArgs

    mistral = _model_dir(tmp_path, "mistral", architectures=["MistralForCausalLM"],
                         sliding_window=64, max_position_embeddings=4096)
    with caplog.at_level("WARNING", logger="kvtier"):
        config = EngineArgs(model=mistral, load_format="dummy").create_engine_config()
    assert config.scheduler.max_model_len == 64 and "sliding window" in caplog.text
    assert EngineArgs(model=mistral, load_format="dummy",
                      max_model_len=48).create_engine_config().scheduler.max_model_len == 48
    with pytest.raises(ConfigError, match="sliding window of 64"):
        EngineArgs(model=mistral, load_format="dummy", max_model_len=128).create_engine_config()
    # Qwen configs carry a window they only use with use_sliding_window.
    qwen = _model_dir(tmp_path, "qwen", architectures=["Qwen2ForCausalLM"], sliding_window=64,
                      use_sliding_window=False, max_position_embeddings=4096)
    assert EngineArgs(model=qwen, load_format="dummy").create_engine_config() \
        .scheduler.max_model_len == 4096


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_layers_the_model_cannot_compute_are_refused(tmp_path, changes, message):
    from kvtier.engine.args import EngineArgs

    path = _model_dir(tmp_path, "odd", **changes)
    with pytest.raises(ConfigError, match=message):
        EngineArgs(model=path, load_format="dummy").create_engine_config()

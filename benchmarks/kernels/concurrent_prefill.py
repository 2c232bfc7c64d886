"""The prefill that runs beside a copy in bench_host_page_io: the engine's real forward, or,
when asked, a stand-in of the same GEMMs and attention (an engine that does not build stops
the run: its files would otherwise name a prefill they did not time)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvtier.model.loader import resolve_model_config

BLOCK_SIZE = 16
ENGINE_KINDS = ("engine", "engine-graphs")  # --prefill: the engine eager, or as it runs by default
PREFILL_KINDS = (*ENGINE_KINDS, "stand-in")


class PrefillStandIn:
    """The preset's prefill of `tokens` tokens as its GEMMs (QKV, O, gate_up, down) and
    causal GQA attention (torch SDPA) per layer, one layer's weights reused; no norms,
    rotary or KV writes."""

    def __init__(self, model: str, tokens: int, dtype: torch.dtype, device: torch.device):
        mc, _ = resolve_model_config(model, "dummy")

        def w(k: int, n: int) -> torch.Tensor:
            return (torch.randn(k, n, device=device) * k**-0.5).to(dtype)

        self.mc, self.tokens = mc, tokens
        self.q_width, self.kv_width = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
        self.w_qkv = w(mc.hidden_size, self.q_width + 2 * self.kv_width)
        self.w_o = w(self.q_width, mc.hidden_size)
        self.w_gate_up = w(mc.hidden_size, 2 * mc.intermediate_size)
        self.w_down = w(mc.intermediate_size, mc.hidden_size)
        self.x = torch.randn(tokens, mc.hidden_size, device=device).to(dtype)

    def __call__(self) -> None:
        t, x, d = self.tokens, self.x, self.mc.head_dim
        for _ in range(self.mc.num_layers):
            q, k, v = (x @ self.w_qkv).split([self.q_width, self.kv_width, self.kv_width], -1)
            qh, kh, vh = (a.view(1, t, -1, d).transpose(1, 2) for a in (q, k, v))
            attn = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, is_causal=True, enable_gqa=True)
            x = x + attn.transpose(1, 2).reshape(t, self.q_width) @ self.w_o
            gate, up = (x @ self.w_gate_up).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ self.w_down


class EnginePrefill:
    """The engine's prefill of one random `tokens`-token prompt (the preset with dummy
    weights, the whole prompt in one step), run until its first token is out: eager, or
    (graphs=True) as the engine runs it by default, its layers' pieces replayed as CUDA
    graphs around the eager attention (kvtier/runner/piecewise_graphs.py)."""

    def __init__(self, model: str, layers_per_block: int, tokens: int, device: torch.device,
                 graphs: bool = False):
        from kvtier.engine.args import EngineArgs
        from kvtier.engine.llm_engine import LLMEngine
        from kvtier.sampling_params import SamplingParams

        mc, _ = resolve_model_config(model, "dummy")
        f = min(layers_per_block, mc.num_layers)
        groups = -(-mc.num_layers // f)
        self.engine = LLMEngine.from_engine_args(EngineArgs(
            model=model, load_format="dummy", device=device.type,
            max_model_len=tokens + BLOCK_SIZE, max_num_seqs=2, max_num_batched_tokens=tokens,
            block_size=BLOCK_SIZE, layers_per_block=f,
            num_gpu_blocks=(tokens // BLOCK_SIZE + 2) * groups, num_host_blocks=groups,
            enforce_eager=not graphs, async_scheduling=False))
        self.params = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
        self.tokens, self.calls = tokens, 0
        self.gen = torch.Generator().manual_seed(1)

    def __call__(self) -> None:
        vocab = self.engine.model_config.vocab_size
        prompt = torch.randint(0, vocab, (self.tokens,), generator=self.gen).tolist()
        self.calls += 1
        self.engine.add_request(f"prefill-{self.calls}", prompt, self.params)
        while self.engine.has_unfinished_requests():
            self.engine.step()


def make_prefill(kind: str, model: str, layers_per_block: int, tokens: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[Callable[[], None], str]:
    """The prefill to run (`kind` "engine" (eager), "engine-graphs" or "stand-in") and a
    line saying which it is."""
    if kind in ENGINE_KINDS:
        graphs = kind == "engine-graphs"
        try:
            prefill = EnginePrefill(model, layers_per_block, tokens, device, graphs)
        except Exception as e:
            raise SystemExit(f"--prefill {kind}: the engine does not build ({type(e).__name__}: "
                             f"{e}); install what it needs, or time --prefill stand-in") from e
        return prefill, (f"engine: {model} dummy, one {tokens}-token prompt to its first token, "
                         + ("piecewise CUDA graphs (the engine's default)" if graphs else "eager"))
    return PrefillStandIn(model, tokens, dtype, device), (
        f"stand-in: {model}'s GEMMs and causal GQA SDPA per layer, one layer's weights reused, "
        f"{tokens} tokens")


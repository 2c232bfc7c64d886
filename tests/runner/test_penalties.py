"""The logit bias and vLLM's penalties against a plain per-token reference of vLLM's
formulas: bias, then repetition over the prompt's and the output's tokens, then frequency
and presence over the output's; only rows that ask for them change; logprobs are those of
the logits before them."""

import pytest
import torch

from kvtier.engine.token_options import BadWords, bad_word_sequences
from kvtier.runner.penalties import apply_penalties
from kvtier.runner.penalty_counts import PenaltyCounts
from kvtier.runner.sampler import SampleRow, sample
from kvtier.sampling_params import InvalidRequestError, SamplingParams

VOCAB = 50


def reference(logits: torch.Tensor, params: SamplingParams, prompt, outputs) -> torch.Tensor:
    x = logits.clone()
    for t, b in params.logit_bias:
        if t < VOCAB:
            x[t] += b
    rp = params.repetition_penalty
    for t in set(prompt) | set(outputs):
        x[t] = x[t] / rp if x[t] > 0 else x[t] * rp
    for t in set(outputs):
        x[t] -= params.frequency_penalty * outputs.count(t) + params.presence_penalty
    return x


CASES = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.7),
    SamplingParams(temperature=0.0, repetition_penalty=0.6, frequency_penalty=0.4),
    SamplingParams(temperature=0.0, presence_penalty=-1.5, frequency_penalty=2.0),
    SamplingParams(temperature=0.0, logit_bias={3: 5.0, 49: -100.0, 500: 1.0},
                   repetition_penalty=1.2),
    SamplingParams(temperature=0.0, logit_bias={8: 2.5}),
]


def rows_for(params_list):
    g = torch.Generator().manual_seed(1)
    rows = []
    for p in params_list:
        prompt = torch.randint(0, VOCAB, (12,), generator=g).tolist()
        outputs = torch.randint(0, VOCAB, (9,), generator=g).tolist() + [4, 4, 4]
        rows.append(SampleRow(p, len(outputs), (), (prompt, outputs)))
    return rows


def put(a):
    return torch.from_numpy(a)


def counted(rows, logits):
    """The rows' counts as the runner keeps them (one request per row)."""
    return PenaltyCounts().view([f"r{i}" for i in range(len(rows))], rows, logits, put)


def test_each_row_gets_the_reference_adjustment():
    logits = torch.randn(len(CASES), VOCAB, generator=torch.Generator().manual_seed(0))
    rows = rows_for(CASES)
    got = logits.clone()
    apply_penalties(got, rows, put, counted(rows, logits))
    for i, (row, p) in enumerate(zip(rows, CASES)):
        prompt, outputs = row.history or ([], [])
        torch.testing.assert_close(got[i], reference(logits[i], p, prompt, outputs))
    torch.testing.assert_close(got[0], logits[0])  # a row that asks for none is untouched


def test_greedy_picks_from_the_adjusted_logits_and_logprobs_from_the_raw_ones():
    logits = torch.randn(len(CASES), VOCAB, generator=torch.Generator().manual_seed(2))
    logits[:, 4] = logits.max() + 1.0  # every row's argmax, until its penalties apply
    rows = [SampleRow(SamplingParams(**{**_fields(r.params), "logprobs": 1}), r.num_output_tokens,
                      (), r.history) for r in rows_for(CASES)]
    before = logits.clone()
    out = sample(logits, rows, penalties=counted(rows, logits))
    assert torch.equal(logits, before)  # the caller's logits are left as they were
    raw = torch.log_softmax(logits, dim=-1)
    for i, row in enumerate(rows):
        prompt, outputs = row.history or ([], [])
        want = int(reference(logits[i], row.params, prompt, outputs).argmax())
        assert out.token_ids[i] == want
        assert out.logprobs[i][want] == pytest.approx(float(raw[i, want]))
    assert out.token_ids[3] != 4  # the frequency penalty moved it off the repeated token


def _fields(p: SamplingParams) -> dict:
    return {k: getattr(p, k) for k in ("temperature", "repetition_penalty", "frequency_penalty",
                                       "presence_penalty", "logit_bias")}


def test_a_penalized_row_without_its_counts_or_tokens_is_an_error():
    row = SampleRow(SamplingParams(temperature=0.0, presence_penalty=1.0), 2, (), None)
    with pytest.raises(RuntimeError, match="counts"):
        apply_penalties(torch.zeros(1, VOCAB), [row], put, None)
    with pytest.raises(RuntimeError, match="output tokens are needed"):
        counted([row], torch.zeros(1, VOCAB))


def test_counts_follow_the_sampled_tokens_and_are_rebuilt_after_a_forget():
    """Each step adds the token it sampled on the device; a request whose row was dropped
    (preempted) is counted again from its lists; rows are reused and the pool grows."""
    pool = PenaltyCounts()
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    logits = torch.zeros(12, VOCAB)
    outputs = [[3, 3], []] + [[] for _ in range(10)]
    rows = [SampleRow(params, len(o), (), ([1, 2], o)) for o in outputs]
    ids = [f"r{i}" for i in range(12)]
    view = pool.view(ids, rows, logits, put)
    assert view.output_counts[0, 3] == 2 and view.in_prompt[1, 2] and not view.in_prompt[1, 3]
    pool.record(view, torch.tensor([5] * 12))
    outputs[0].append(5)  # the engine appends it later (async): the counts have it already
    rows[0] = SampleRow(params, 3, (), ([1, 2], outputs[0][:2]))  # one short in its list
    again = pool.view(ids[:1], rows[:1], logits, put)
    assert again.output_counts[0, 5] == 1 and again.output_counts[0, 3] == 2
    pool.forget("r0")
    with pytest.raises(RuntimeError):  # rebuilt from a list one short: refused
        pool.view(ids[:1], rows[:1], logits, put)
    rows[0] = SampleRow(params, 3, (), ([1, 2], outputs[0]))
    rebuilt = pool.view(["r0"], rows[:1], logits, put)
    assert rebuilt.output_counts[0].tolist() == again.output_counts[0].tolist()


@pytest.mark.parametrize("kw", [dict(presence_penalty=2.5), dict(frequency_penalty=-3.0),
                                dict(repetition_penalty=0.0), dict(repetition_penalty=-1.0),
                                dict(presence_penalty=float("nan")), dict(logit_bias={"a": 1}),
                                dict(logit_bias={-2: 1.0}), dict(logit_bias={1: float("nan")})])
def test_bad_values_are_refused(kw):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kw)


def test_logit_bias_is_kept_hashable_and_sorted():
    p = SamplingParams(logit_bias={"9": 1, 2: -0.5})
    assert p.logit_bias == ((2, -0.5), (9, 1.0))
    assert hash(p) == hash(SamplingParams(logit_bias={2: -0.5, 9: 1.0}))


def test_the_engine_refuses_a_bias_outside_the_vocabulary():
    from kvtier import LLM

    llm = LLM("tiny-llama", load_format="dummy", device="cpu", dtype="float32")
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        llm.engine.add_request("r", [5, 6], SamplingParams(logit_bias={vocab: 1.0}))
    assert not llm.engine.has_unfinished_requests()


def test_allowed_token_ids_keep_only_those_logits():
    """vLLM's allowed_token_ids: a row draws only from its ids (greedy: the best of them;
    sampled: never another), other rows are untouched, and a banned id stays banned."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))
    logits[:, 0] = logits.max() + 5.0  # every row's argmax unless it is not allowed
    only = SamplingParams(temperature=0.0, allowed_token_ids=[9, 4, 17])
    sampled = SamplingParams(temperature=1.0, seed=1, allowed_token_ids=[11, 12])
    rows = [SampleRow(only, 0, ()), SampleRow(SamplingParams(temperature=0.0), 0, ()),
            SampleRow(only, 0, (4,))]  # 4 banned too (min_tokens' eos)
    out = sample(logits, rows)
    assert out.token_ids[0] == max((4, 9, 17), key=lambda t: float(logits[0, t]))
    assert out.token_ids[1] == 0
    assert out.token_ids[2] == max((9, 17), key=lambda t: float(logits[2, t]))
    for _ in range(20):
        assert sample(logits[:1], [SampleRow(sampled, 0, ())]).token_ids[0] in (11, 12)
    # Logprobs are vLLM's raw ones: before the bans and the allowed ids' mask.
    with_lp = SamplingParams(temperature=0.0, logprobs=1, allowed_token_ids=[9, 17])
    got = sample(logits[:1], [SampleRow(with_lp, 0, (9,))])
    raw = torch.log_softmax(logits[0], dim=-1)
    assert got.token_ids == [17] and got.logprobs[0][17] == pytest.approx(float(raw[17]))
    assert got.logprobs[0][0] == pytest.approx(float(raw[0]))  # the top one, not allowed


@pytest.mark.parametrize("ids", [[], [-1], [1.5], [True], ["3"], [3, None]])
def test_bad_allowed_token_ids_are_refused(ids):
    with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=ids)


def test_allowed_token_ids_are_kept_hashable_and_sorted():
    assert SamplingParams(allowed_token_ids=[9, 2, 9]).allowed_token_ids == (2, 9)
    assert SamplingParams().allowed_token_ids is None


def test_the_engine_refuses_an_allowed_id_outside_the_vocabulary():
    from kvtier import LLM

    llm = LLM("tiny-llama", load_format="dummy", device="cpu", dtype="float32")
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
        llm.engine.add_request("r", [5, 6], SamplingParams(allowed_token_ids=[1, vocab]))
    assert not llm.engine.has_unfinished_requests()
    out = llm.generate([[5, 6]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                               allowed_token_ids=[7, 8]))
    assert set(out[0].outputs[0].token_ids) <= {7, 8}


def test_bad_words_are_banned_where_the_output_ends_with_their_start():
    """vLLM's bad_words: a one-token word is always banned; a longer one's last token only
    after its others; each word is tokenized as written and, where that gives as many
    tokens with another first one, after a space."""

    class Tok:  # one id a letter; a space joins the letter after it (id 100 + letter)
        bos_token_id = 1

        def encode(self, text, add_special_tokens=True):
            ids, space = [1] if add_special_tokens else [], False
            for c in text:
                if c == " ":
                    space = True
                    continue
                ids.append((100 if space else 10) + ord(c) - ord("a"))
                space = False
            return ids

    assert bad_word_sequences(Tok(), ["c", "  ab", ""]) == (
        (12,), (102,), (10, 11), (100, 11))
    out: list[int] = []
    words = BadWords(((12,), (10, 11)), out)
    assert words.banned() == (12,) and words.needs_last_token
    out.append(10)
    assert words.banned() == (11, 12)
    out.append(13)
    assert words.banned() == (12,)
    assert not BadWords(((12,),), out).needs_last_token
    with pytest.raises(InvalidRequestError, match="bad_words"):
        bad_word_sequences(Tok(), ["z"], vocab_size=30)  # z: 35


def test_an_engine_never_generates_a_bad_word():
    """Greedy tokens with a word banned: the same run until the word would come, then
    never the word's token."""
    from kvtier import LLM

    llm = LLM("tiny-llama", load_format="dummy", device="cpu", dtype="float32")
    tok = llm.engine.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = llm.generate([[5, 6, 7]], greedy)[0].outputs[0].token_ids
    word = tok.decode([plain[3]])
    banned = {s[-1] for s in bad_word_sequences(tok, [word]) if len(s) == 1}
    assert plain[3] in banned
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=12,
                                                    ignore_eos=True, bad_words=[word]))
    ids = out[0].outputs[0].token_ids
    assert ids[:3] == plain[:3] and not banned & set(ids)
    with pytest.raises(InvalidRequestError, match="bad_words"):
        SamplingParams(bad_words=[3])


@pytest.mark.gpu
def test_on_the_gpu_allowed_ids_and_bans_give_the_cpu_tokens_and_logprobs():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    rows = [SampleRow(SamplingParams(temperature=0.0, logprobs=2, allowed_token_ids=[3, 9, 17]),
                      0, (9,)),
            SampleRow(SamplingParams(temperature=0.0, logprobs=1), 0, (0, 1, 2)),
            SampleRow(SamplingParams(temperature=0.8, seed=5, allowed_token_ids=[4, 40]), 0, ())]
    cpu, gpu = sample(logits, rows), sample(logits.cuda(), rows)
    assert gpu.token_ids[:2] == cpu.token_ids[:2]
    assert gpu.token_ids[2] in (4, 40)  # a seeded draw: the device's own generator
    for a, b in zip(gpu.logprobs, cpu.logprobs):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.keys() == b.keys()
            assert all(a[t] == pytest.approx(b[t], abs=1e-5) for t in a)

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests are small; one intra-op thread per xdist worker avoids oversubscribing 2 cores."""
    torch.set_num_threads(1)


FAMILIES = {
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "llama-untied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": False}),
}


def tiny_hf_model(family: str, *, vocab_size: int = 101, layers: int = 3, seed: int = 0):
    """A randomly initialised transformers model of one family, small enough for any test.

    Weights are scaled up so the random model has peaked, position-dependent distributions
    (a default init gives near-uniform logits, where greedy decoding is all ties)."""
    import transformers

    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.mul_(4.0 if "embed" in name or "lm_head" in name else 2.0)
    return model


def split_forms(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict as a Q4_K_M file gives it: every projection's weights 4-bit codes
    dequantized, but the value projection's Q6_K ones."""
    from quickdraft.kernels import superblock

    out = {}
    for name, tensor in state.items():
        if name.endswith("v_proj.weight"):
            tensor = superblock.quantize_q6k(tensor.float()).dequantize()
        elif name.endswith("proj.weight"):
            tensor = superblock.quantize(tensor.float(), 4).dequantize()
        out[name] = tensor
    return out


def prompt_logits(model, prompt: list[int]) -> torch.Tensor:
    """[1, T, V]: a model's logits over ``prompt`` in one fresh pass."""
    tokens = torch.tensor([prompt])
    positions = torch.arange(len(prompt)).unsqueeze(0)
    return model.forward(tokens, positions, model.new_cache(1, len(prompt))).logits


def tiny_runners(layers: int) -> dict:
    """Every tiny family as the native runner, by family name."""
    from quickdraft.models.llama import LlamaRunner

    runners = {}
    for family in FAMILIES:
        hf = tiny_hf_model(family, layers=layers)
        runners[family] = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    return runners


@pytest.fixture(scope="session")
def smollm2():
    from quickdraft.models.loading import load_model

    return load_model("smollm2-135m")


def tiny_folder_and_corpus(tmp_path, smollm2, family: str):
    """A tiny model of ``family`` saved as a folder with SmolLM2's tokenizer (vocabulary
    49,152), and a small chat corpus of two kinds: what the train commands read."""
    import json

    folder = tmp_path / "tiny"
    tiny_hf_model(family, vocab_size=49152, layers=2).save_pretrained(folder)
    smollm2[1].hf.save_pretrained(folder)
    chats = [
        {"kind": kind, "messages": [
            {"role": "user", "content": f"Question {i} about {kind}?"},
            {"role": "assistant", "content": f"An answer about {kind} number {i}, in words."},
        ]}
        for kind in ("code", "math") for i in range(12)
    ]  # fmt: skip
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(c) for c in chats))
    return folder, corpus


def shipped_drafter_runs(smollm2, drafter) -> list[float]:
    """A shipped SmolLM2 drafter on two chat prompts: asserts its greedy outputs equal plain
    decoding's and returns each prompt's mean accepted length."""
    from quickdraft import SamplingParams, SpecConfig, generate

    target, tokenizer = smollm2
    sampling = SamplingParams(temperature=0, max_new_tokens=40)
    whole = SpecConfig(adaptive_k=False)  # the drafter's own drafts, every step
    accepted = []
    for text in ("Write a Python function that reverses a list.", "What is 12 times 7?"):
        prompt = tokenizer.apply_chat(text)
        expected = generate(target, prompt, sampling=sampling).token_ids
        out = generate(target, prompt, sampling=sampling, spec=whole, draft=drafter)
        assert out.token_ids == expected
        accepted.append(out.stats.mean_accepted_length)
    return accepted


def random_shortlists(vocab: int, hidden: int) -> dict:
    """One shortlist of each kind over a tiny vocabulary, with an untrained router (greedy
    identity holds for any shortlist; these exercise every code path)."""
    from quickdraft.vocab.router import Router, RouterConfig
    from quickdraft.vocab.shortlist import ClusterShortlist, FrequencyShortlist

    torch.manual_seed(3)
    ranked = torch.randperm(vocab)
    router = Router(RouterConfig(hidden, 8, width=16)).eval()
    assignment = torch.arange(vocab) % 8
    core = assignment.clone()
    core[ranked[:20]] = -1  # the hybrid: a core of frequent tokens outside the clusters
    return {
        "fr": FrequencyShortlist(ranked, [40]),
        "fr-pa": FrequencyShortlist.position_aware(ranked, 40, 4),
        "dyna": ClusterShortlist(assignment, router, 3, position_aware=False),
        "dyna-pa": ClusterShortlist(assignment, router, 3),
        "dyna-pa-threaded": ClusterShortlist(assignment, router, 3, parallel=True),
        "hybrid": ClusterShortlist(core, router, 2, context=True),
    }


def recorded_drafts(drafter) -> set[int]:
    """Every token ``drafter`` proposes from now on is added to the returned set."""
    drafted: set[int] = set()
    propose = drafter.propose

    def recording(batch):
        draft = propose(batch)
        drafted.update(draft.tokens.flatten().tolist())
        return draft

    drafter.propose = recording
    return drafted

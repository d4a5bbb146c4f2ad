"""The library's defaults and the output's invariants: EOS stops, shipped drafters through the
API, stop strings that land with max_new_tokens, files and partial conversions."""

import pytest

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.models.toy import NGramLM, ToyTokenizer


class EosToyTokenizer(ToyTokenizer):
    eos_token_ids = (2,)


def toy_target() -> NGramLM:
    return NGramLM.random(8, order=3, seed=3, sharpness=2.0)


def test_generation_stops_at_the_tokenizers_eos_unless_told_not_to():
    target, tokenizer = toy_target(), EosToyTokenizer(8)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=200, seed=5)
    stopped = generate(target, "dab", sampling=sampling, tokenizer=tokenizer)
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == 2
    assert 2 not in stopped.token_ids[:-1]
    ignoring = SamplingParams(temperature=1.0, max_new_tokens=200, seed=5, ignore_eos=True)
    full = generate(target, "dab", sampling=ignoring, tokenizer=tokenizer)
    assert full.finish_reason == "length" and len(full.token_ids) == 200
    assert full.token_ids[: len(stopped.token_ids)] == stopped.token_ids


@pytest.mark.parametrize("k", [1, 4])
def test_stop_string_and_length_in_one_step_agree(k):
    """Regression: when the step that reaches max_new_tokens also completes a stop string,
    token_ids end at the stop string, text is cut before it and finish_reason is "stop"."""
    target, tokenizer = toy_target(), ToyTokenizer(8)
    plain = generate(
        target,
        "dab",
        sampling=SamplingParams(temperature=0, max_new_tokens=40),
        tokenizer=tokenizer,
    ).token_ids
    text = tokenizer.decode(plain)
    checked = 0
    for length in range(3, 40):
        stop = text[length - 2 : length]
        if stop in text[: length - 1]:
            continue  # it would stop earlier
        sampling = SamplingParams(temperature=0, max_new_tokens=length, stop=(stop,))
        spec = SpecConfig(method="draft_model", num_speculative_tokens=k)
        out = generate(target, "dab", sampling=sampling, spec=spec, draft=target,
                       tokenizer=tokenizer)  # fmt: skip
        assert out.token_ids == plain[:length], length
        assert out.finish_reason == "stop", length
        assert out.text == text[: length - 2], length
        checked += 1
    assert checked >= 3


def test_shipped_drafters_are_found_through_the_api(smollm2):
    target, tokenizer = smollm2
    assert target.name == "smollm2-135m"
    prompt = tokenizer.apply_chat("Write a Python function that adds two numbers.")
    sampling = SamplingParams(temperature=0, max_new_tokens=12)
    expected = generate(target, prompt, sampling=sampling, tokenizer=tokenizer).token_ids
    for method in ("eagle", "medusa"):
        out = generate(target, prompt, sampling=sampling, spec=SpecConfig(method=method),
                       tokenizer=tokenizer)  # fmt: skip
        assert out.token_ids == expected, method
    assert target.truncated(2).name is None  # another model: nothing ships for it


def test_k_zero_is_rejected_never_replaced():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpecConfig(method="ngram", num_speculative_tokens=0)


def test_an_interrupted_conversion_is_removed_on_the_next_start(tmp_path):
    import socket

    from quickdraft.artifacts import partial_suffix, remove_stale_partials

    gone = 2**22 + 12345  # above Linux's largest pid: no such process
    host = socket.gethostname()
    dead = tmp_path / f"abc.partial-{host}-{gone}"
    legacy = tmp_path / f"def.partial-{gone}"  # written before names carried the host
    for folder in (dead, legacy):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    mine = tmp_path / f"abc.partial-{partial_suffix()}"
    other_host = tmp_path / f"abc.partial-{host}x-{gone}"
    mine.mkdir()
    other_host.mkdir()
    remove_stale_partials(tmp_path, "*.partial-*")
    assert not dead.exists() and not legacy.exists()
    assert mine.exists() and other_host.exists()


def test_safetensors_written_for_others_get_the_umasks_mode(tmp_path):
    """A drafter or export must be readable by whom the umask allows (safetensors' own
    save_file makes 0600 files), whole and with its metadata, and leaves no partial file."""
    import os

    import torch
    from safetensors import safe_open

    from quickdraft.artifacts import read_safetensors, write_safetensors

    tensors = {"w": torch.arange(6.0).view(2, 3), "ids": torch.tensor([3, 1], dtype=torch.int16)}
    old = os.umask(0o027)
    try:
        write_safetensors(tmp_path / "x.safetensors", tensors, {"note": "n"})
        (tmp_path / "x.json").write_text("{}")
    finally:
        os.umask(old)
    mode = (tmp_path / "x.safetensors").stat().st_mode & 0o777
    assert mode == (tmp_path / "x.json").stat().st_mode & 0o777
    back = read_safetensors(tmp_path / "x.safetensors", "remedy")
    assert all(torch.equal(back[k], v) for k, v in tensors.items()) and back.keys() == {"w", "ids"}
    with safe_open(tmp_path / "x.safetensors", "pt") as handle:
        assert handle.metadata() == {"note": "n"}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["x.json", "x.safetensors"]


def test_a_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    from quickdraft.models import gguf
    from quickdraft.models.sources import packaged_gguf

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match=r"broken\.gguf: unreadable GGUF"):
        gguf.convert(broken)

    def disk_full(path, folder):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf, "_save_tokenizer", disk_full)  # fails after the weights
    with pytest.raises(OSError, match="No space"):
        gguf.convert(packaged_gguf("smollm2-135m"))
    converted = tmp_path / "cache" / "converted"
    assert not converted.exists() or not any(converted.iterdir())


def test_a_draft_smaller_than_the_prompts_ids_reads_them_as_its_last_id():
    """A padded target vocabulary can hold ids past the draft's: the draft reads them as its
    last id (in its prefill and its steps alike), so only its proposals change; the request
    is checked and runs before it joins, never failing mid-step."""
    target = NGramLM.random(8, order=2, seed=0)
    small = NGramLM.random(5, order=2, seed=1)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2)
    from quickdraft.drafters.registry import build_drafter

    drafter = build_drafter(spec, target, small, same_tokenizer=True)
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    out = generate(target, [1, 7, 3], spec=spec, draft=drafter, sampling=greedy)
    assert out.token_ids == generate(target, [1, 7, 3], sampling=greedy).token_ids


def test_temperatures_that_overflow_are_rejected_and_small_valid_ones_sample():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=1e-38)
    target = toy_target()
    out = generate(target, [1, 2], sampling=SamplingParams(temperature=1e-5, top_p=1e-6,
                                                          max_new_tokens=4, seed=1))  # fmt: skip
    greedy = generate(target, [1, 2], sampling=SamplingParams(temperature=0, max_new_tokens=4))
    assert out.token_ids == greedy.token_ids  # so cold and narrow it is greedy, not NaN


def test_prompt_ids_of_any_integer_type_run_and_others_are_named():
    import numpy as np
    import torch

    target = toy_target()
    greedy = SamplingParams(temperature=0, max_new_tokens=3)
    expected = generate(target, [1, 2, 3], sampling=greedy).token_ids
    assert generate(target, np.array([1, 2, 3]), sampling=greedy).token_ids == expected
    assert generate(target, iter([1, 2, 3]), sampling=greedy).token_ids == expected
    for bad in ([1.5, 2], [2**70], [True, 2], torch.tensor([1.0, 2.0]), [[1, 2], [3, 4]]):
        with pytest.raises(ValueError, match="prompt: token ids must be integers"):
            generate(target, bad, sampling=greedy)
    for bad in (5, None, torch.ones(2, 2, dtype=torch.long)):
        with pytest.raises(ValueError, match="prompt must be"):
            generate(target, bad, sampling=greedy)
    with pytest.raises(ValueError, match="stop must hold"):
        SamplingParams(stop=[10**5000])


@pytest.mark.parametrize("step", [1, 2, 64])
def test_a_stop_string_split_over_byte_tokens_is_found_however_the_steps_fall(smollm2, step):
    """Regression: SmolLM2 spends two tokens on each of 结, 束 and 语, so this stop string is
    six tokens for three characters. Looking back as many tokens as it has characters missed
    it when the tokens came one a step (plain decoding) and found it when a speculative step
    brought several: the output depended on speculation."""
    from quickdraft.engine.requests import Request

    tokenizer = smollm2[1]
    ids = tokenizer.encode("Hello 结束语 and more")
    assert len(tokenizer.encode("结束语")) > len("结束语") + 1
    sampling = SamplingParams(temperature=0, max_new_tokens=64, stop=("结束语",))
    request = Request("r", [1], sampling, tokenizer, depth=1)
    for start in range(0, len(ids), step):
        request.extend(ids[start : start + step], drafted=0)
        if request.finish_reason is not None:
            break
    assert request.finish_reason == "stop"
    assert request.text() == "Hello "
    assert tokenizer.decode(request.output).endswith("结束语")

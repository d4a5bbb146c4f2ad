"""Follow-up prompts (``quickdraft data followups``): a second user turn after a target's own
reply, answered by ``data regenerate`` and trained on from the new reply only."""

import json

import pytest
from conftest import tiny_folder_and_corpus

from quickdraft import SamplingParams, generate
from quickdraft.train.corpus import tokenize
from quickdraft.train.followups import FORMS, followup_prompts


def _chat(kind: str, question: str, reply: str) -> dict:
    return {
        "kind": f"{kind}/generated",
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ],
    }


def test_followups_take_each_kind_in_turn_and_skip_what_does_not_fit(tmp_path):
    replies = tmp_path / "replies.jsonl"
    records = [_chat("code", f"def f{i}():", f"return {i}") for i in range(4)]
    records += [_chat("summarization", f"Summarize text {i}.", "It says things.") for i in range(2)]
    records += [
        _chat("code", "def long():", "x" * 2000),  # longer than max_chars
        _chat("code", "def empty():", "  "),  # no reply to follow
        {
            "kind": "chat",
            "messages": [*_chat("qa", "a", "b")["messages"], {"role": "user", "content": "c"}],
        },
        {"kind": "chat", "prompt": "not a chat"},
    ]
    replies.write_text("".join(json.dumps(r) + "\n" for r in records))
    made = followup_prompts([replies], 5, seed=1)
    assert [r["kind"] for r in made] == ["code", "summarization", "code", "summarization", "code"]
    for record in made:
        first, reply, follow = record["messages"]
        assert (first["role"], reply["role"], follow["role"]) == ("user", "assistant", "user")
        assert follow["content"] in FORMS[record["kind"]]
        assert record["source"].startswith("follow-up to replies.jsonl:")
    assert len({r["messages"][0]["content"] for r in made}) == 5  # one follow-up a chat
    assert followup_prompts([replies], 5, seed=1) == made  # seeded
    assert len(followup_prompts([replies], 100)) == 6
    with pytest.raises(ValueError, match=r"replies: .*missing\.jsonl is not a file"):
        followup_prompts([tmp_path / "missing.jsonl"], 5)
    with pytest.raises(ValueError, match="replies: no chat"):
        followup_prompts([replies], 5, max_chars=5)


def test_followups_answered_by_regenerate_train_on_the_new_reply_only(tmp_path, smollm2):
    """The CLI writes follow-ups; regenerate answers the whole conversation with the target's
    greedy reply and marks it (``reply_turn``); a second run skips them; tokenize scores from
    that reply on."""
    from quickdraft.cli import main
    from quickdraft.models.loading import load_model

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    replies = tmp_path / "replies.jsonl"
    chats = [_chat("code", f"def f{i}():", f"return {i}") for i in range(2)]
    replies.write_text("".join(json.dumps(r) + "\n" for r in chats))
    prompts, out = tmp_path / "followups.jsonl", tmp_path / "second.jsonl"
    argv = ["data", "followups", "--replies", str(replies), "--out", str(prompts)]
    assert main([*argv, "--count", "5"]) == 0
    assert len(prompts.read_text().splitlines()) == 2
    regen = ["data", "regenerate", "--target", str(folder), "--prompts", str(prompts), "--out",
             str(out), "--max-new-tokens", "4", "--batch-size", "2"]  # fmt: skip
    assert main(regen) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    model, tokenizer = load_model(folder)
    for record in written:
        turns = record["messages"]
        assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
        assert record["reply_turn"] == 3 and record["kind"] == "code/generated"
        ids = generate(
            model,
            tokenizer.apply_chat(turns[:3]),
            sampling=SamplingParams(
                temperature=0, max_new_tokens=4, stop_token_ids=tokenizer.eos_token_ids
            ),
        ).token_ids
        assert turns[3]["content"] == tokenizer.decode(ids)
        sequence = tokenize(record, tokenizer, 512)
        assert sequence.start == len(tokenizer.apply_chat(turns[:3]))
        # A one-turn reply still scores from its first reply.
        plain = {"kind": "code", "messages": turns[:2]}
        assert tokenize(plain, tokenizer, 512).start == len(tokenizer.apply_chat(turns[:1]))
        with pytest.raises(ValueError, match="reply_turn: 2 is not the index of an assistant"):
            tokenize({**record, "reply_turn": 2}, tokenizer, 512)
    assert main(regen) == 0  # answered already: nothing added
    assert len(out.read_text().splitlines()) == 2
    # A second part beside the first: what the first answers is skipped, the first untouched.
    part2 = tmp_path / "part2.jsonl"
    first = out.read_text()
    second = [*regen[:7], str(part2), *regen[8:], "--answered"]
    assert main([*second, str(out)]) == 0
    assert (not part2.exists() or part2.read_text() == "") and out.read_text() == first
    assert main([*second, str(tmp_path / "x")]) == 2
    assert main([*argv[:3], str(tmp_path / "none.jsonl"), *argv[4:]]) == 2

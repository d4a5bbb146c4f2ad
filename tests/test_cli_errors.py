"""Bad invocations of every command: each exits non-zero with one line on stderr and no
traceback. Files are corrupted in the test: truncated, random bytes, wrong keys, wrong shapes."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import tiny_folder_and_corpus
from safetensors.torch import save_file

from quickdraft.cli import main
from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads, save_heads


@pytest.fixture(scope="module")
def files(tmp_path_factory, smollm2):
    """Broken files and folders of every kind quickdraft reads."""
    root = tmp_path_factory.mktemp("broken")
    made = {"root": root}
    (root / "a_file.txt").write_text("not a folder")
    made["file"] = root / "a_file.txt"
    made["text_model"] = root / "model.txt"
    made["text_model"].write_text("hello")
    made["junk_gguf"] = root / "junk.gguf"
    made["junk_gguf"].write_bytes(b"GGUF" + os.urandom(300))
    made["empty_folder"] = root / "empty"
    made["empty_folder"].mkdir()
    bad_config = root / "bad_config"
    bad_config.mkdir()
    (bad_config / "config.json").write_text("{not json")
    made["bad_config"] = bad_config
    no_type = root / "no_type"
    no_type.mkdir()
    (no_type / "config.json").write_text(json.dumps({"hidden_size": 8}))
    made["no_type"] = no_type
    folder, corpus = tiny_folder_and_corpus(root, smollm2, "llama-untied")
    made["tiny"], made["corpus"] = folder, corpus
    truncated = root / "truncated_model"
    truncated.mkdir()
    for item in folder.iterdir():
        (truncated / item.name).write_bytes(item.read_bytes())
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    made["truncated_model"] = truncated
    no_tokenizer = root / "no_tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text((folder / "config.json").read_text())
    made["no_tokenizer"] = no_tokenizer

    hidden = smollm2[0].config.hidden_size
    good = root / "medusa_good"
    save_heads(good, MedusaHeads(MedusaConfig(hidden_size=hidden, vocab_size=49152)))
    made["good_heads"] = good  # SmolLM2's width: not the tiny model's
    for name, edit in {
        "medusa_bad_json": lambda d: (d / "medusa.json").write_text("[1, 2"),
        "medusa_no_config": lambda d: (d / "medusa.json").write_text(json.dumps({"x": 1})),
        "medusa_bad_field": lambda d: (d / "medusa.json").write_text(
            json.dumps({"config": {"hidden_size": hidden, "vocab_size": 49152, "heads": 3}})
        ),
        "medusa_random_weights": lambda d: (d / "medusa.safetensors").write_bytes(os.urandom(4096)),
        "medusa_head_count": lambda d: (d / "medusa.json").write_text(
            json.dumps({"config": {"hidden_size": hidden, "vocab_size": 49152, "num_heads": 5}})
        ),
        "medusa_no_weights": lambda d: (d / "medusa.safetensors").unlink(),
        "medusa_wrong_vocab": lambda d: save_file(
            {"vocab": torch.tensor([1, 2, 99999])}, str(d / "medusa.safetensors")
        ),
    }.items():
        broken = root / name
        broken.mkdir()
        for item in good.iterdir():
            (broken / item.name).write_bytes(item.read_bytes())
        edit(broken)
        made[name] = broken
    from quickdraft.drafters.eagle.io import eagle_folder

    shipped = eagle_folder("smollm2-135m")
    made["shipped_eagle"] = shipped
    for name, edit in {
        "eagle_bad_json": lambda d: (d / "eagle.json").write_text("{"),
        "eagle_truncated": lambda d: (d / "eagle.safetensors").write_bytes(
            (shipped / "eagle.safetensors").read_bytes()[:1000]
        ),
        "eagle_missing_keys": lambda d: (d / "eagle.json").write_text(json.dumps({"cfg": {}})),
    }.items():
        broken = root / name
        broken.mkdir()
        for item in shipped.iterdir():
            if item.is_file():
                (broken / item.name).write_bytes(item.read_bytes())
        edit(broken)
        made[name] = broken
    made["bad_prompts"] = root / "prompts.jsonl"
    made["bad_prompts"].write_text('{"prompt": "ok"}\n{broken\n')
    made["string_messages"] = root / "string_messages.jsonl"
    made["string_messages"].write_text('{"messages": "hello"}\n')
    made["role_less"] = root / "role_less.jsonl"
    made["role_less"].write_text('{"messages": [{"content": "hi"}]}\n')
    # A config transformers refuses (hidden size not a multiple of the heads), no weights.
    invalid = root / "invalid_config"
    invalid.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (invalid / "config.json").write_text(json.dumps({**config, "hidden_size": 30}))
    made["invalid_config"] = invalid
    # A draft whose tokenizer is larger than its embedding table.
    small = root / "small_vocab"
    small.mkdir()
    for item in folder.iterdir():
        (small / item.name).write_bytes(item.read_bytes())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 101}))
    made["small_vocab"] = small
    return made


def invocations(f) -> list[list[str]]:
    out = str(f["root"] / "out")
    gen = ["generate", "hi", "--max-new-tokens", "2"]
    medusa = [*gen, "--method", "medusa", "--medusa-dir"]
    eagle = [*gen, "--method", "eagle", "--eagle-dir"]
    return [
        [],
        ["no-such-command"],
        [*gen, "-k", "0"],
        [*gen, "-k", "-3"],
        [*gen, "-k", "65"],
        [*gen, "-k", "four"],
        [*gen, "--temperature", "-1"],
        [*gen, "--temperature", "nan"],
        [*gen, "--temperature", "1e-38"],
        [*gen, "--top-p", "0"],
        [*gen, "--top-p", "1e-46"],
        [*gen, "--top-p", "1.5"],
        [*gen, "--top-k", "-1"],
        ["generate", "hi", "--max-new-tokens", "0"],
        ["generate", "hi", "--max-new-tokens", "100000000"],
        [*gen, "--seed", "-1"],
        [*gen, "--seed", str(2**64)],
        [*gen, "--method", "bogus"],
        [*gen, "--method", "medusa", "--tree", "300,300,300"],
        [*gen, "--method", "medusa", "--tree", "100,100,100"],
        [*gen, "--method", "medusa", "--tree", "fit:0"],
        [*gen, "--method", "eagle", "--tree", "1000000,1,1"],
        [*gen, "--method", "eagle", "--tree", "6,4,10,2"],
        [*gen, "--method", "eagle", "--tree", "6,4"],
        [*gen, "--method", "lookahead", "--lookahead-window", "100000"],
        [*gen, "--method", "lookahead", "--lookahead-ngram", "1"],
        [*gen, "--method", "lookahead", "--lookahead-window", "60", "--lookahead-ngram", "9"],
        [*gen, "--method", "ngram", "--tree", "4,2,1"],
        [*gen, "--method", "ngram", "--eagle-lookup", "5"],
        [*gen, "--method", "eagle", "--eagle-lookup", "-1"],
        [*gen, "--prompt-lookup-min", "5", "--prompt-lookup-max", "2"],
        [*gen, "--method", "ngram", "--draft-temperature", "0.5"],
        [*gen, "--method", "ngram", "--shortlist", "fr:8"],
        [*gen, "--shortlist", "bogus"],
        [*gen, "--threads", "0"],
        [*gen, "--device", "cuda"],
        [*gen, "--device", "potato"],
        [*gen, "--backend", "bogus"],
        [*gen, "--acceptance", "bogus"],
        [*gen, "--target", "/no/such/model.gguf"],
        [*gen, "--target", str(f["text_model"])],
        [*gen, "--target", str(f["junk_gguf"])],
        [*gen, "--target", str(f["empty_folder"])],
        [*gen, "--target", str(f["bad_config"])],
        [*gen, "--target", str(f["no_type"])],
        [*gen, "--target", str(f["truncated_model"])],
        [*gen, "--target", str(f["no_tokenizer"])],
        [*gen, "--method", "draft_model"],
        [*gen, "--method", "ngram", "--draft", "smollm2-135m"],
        [*gen, "--draft", "/no/such/draft"],
        [*medusa, "/no/such/folder"],
        *([*medusa, str(f[name])] for name in f if name.startswith("medusa_")),
        *([*eagle, str(f[name])] for name in f if name.startswith("eagle_")),
        [*eagle, str(f["shipped_eagle"]), "--target", str(f["tiny"])],
        ["generate", "caf\udce9", "--max-new-tokens", "2"],
        ["bench", "--methods", "ar", "--out", str(f["file"])],
        ["bench", "--methods", "bogus", "--out", out],
        ["bench", "--tasks", "bogus", "--out", out],
        ["bench", "--methods", "ar"],
        ["theory", "--out", str(f["file"])],
        ["theory", "--out", out, "--draft-cost", "-1"],
        ["conformance", "--alpha", "nan"],
        ["conformance", "--alpha", "2"],
        ["conformance", "--samples", "0"],
        ["conformance", "--samples", "many"],
        ["train", "medusa", "--target", "smollm2-135m", "--data", str(f["corpus"]),
         "--out", str(f["file"])],
        ["train", "medusa", "--target", "smollm2-135m", "--data", "/no/such.jsonl",
         "--out", out],
        ["export", "eagle", "--target", "smollm2-135m", "--out", str(f["file"])],
        ["export", "eagle", "--target", "smollm2-135m", "--eagle-dir", "/no/such", "--out", out],
        ["export", "eagle", "--target", "qwen2.5-coder-0.5b-nope", "--out", out],
        ["export", "eagle", "--target", str(f["tiny"]), "--eagle-dir",
         str(f["shipped_eagle"]), "--out", out],  # a drafter made for another target
        ["export", "eagle", "--target", "smollm2-135m", "--engine", "llama.cpp",
         "--target-gguf", "/no/such.gguf", "--out", out],
        ["export", "eagle", "--target", "smollm2-135m", "--engine", "llama.cpp",
         "--target-gguf", str(f["junk_gguf"]), "--out", out],
        ["export", "eagle", "--target", "smollm2-135m", "--target-gguf", str(f["junk_gguf"]),
         "--out", out],  # a GGUF for an engine that takes none
        ["export", "eagle", "--target", str(f["tiny"]), "--engine", "llama.cpp", "--out", out],
        ["export", "medusa", "--target", str(f["tiny"]), "--medusa-dir", str(f["good_heads"]),
         "--out", out],
        ["pick", "--calibrate", "/no/such/prompts.jsonl"],
        ["pick", "--calibrate", str(f["bad_prompts"])],
        ["pick", "--methods", "bogus"],
        ["pick", "--temperature", "-2"],
        ["pick", "--draft-gb", "nan"],
        ["pick", "--memory-gb", "inf"],
        ["bench", "--methods", "", "--out", out],
        ["conformance", "--samples", "1"],
        ["conformance", "--samples", "99999999999999999"],
        ["pick", "--methods", ",,,"],
        ["train", "router", "--draft", "smollm2-135m", "--data", str(f["corpus"]), "--out", out,
         "--core", "-1"],
        [*gen, "--max-new-tokens", " 5"],
        [*gen, "--regex", "ab\\"],  # a lone trailing backslash, refused, not dropped
        [*gen, "--regex", "a{1000000}"],  # fails along its first tokens: refused up front
        ["serve", "--allowed-hosts", "bad host", "--speculative-config", '{"method": "ar"}'],
        [*gen, "-k", "\u0663"],
        [*gen, "--method", "medusa", "--tree", "9" * 10000],
        [*gen, "--shortlist", " fr:32"],
        [*gen, "--shortlist", "fr:\u00b2"],
        [*gen, "--method", "eagle", "--eagle-dir", "a\x00b"],
        [*gen, "--target", str(f["invalid_config"])],
        [*gen, "--method", "draft_model", "--draft", str(f["small_vocab"])],
        ["train", "medusa", "--target", "smollm2-135m", "--data", str(f["string_messages"]),
         "--out", out],
        ["train", "medusa", "--target", "smollm2-135m", "--data", str(f["role_less"]),
         "--out", out],
    ]  # fmt: skip


def test_sixty_bad_invocations_fail_with_one_line(files, capsys):
    cases = invocations(files)
    assert len(cases) >= 60
    for argv in cases:
        try:
            code = main(argv)
        except SystemExit as exit_info:  # argparse's own errors
            code = exit_info.code
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        # A model's loading stages print before a fault found after loading it.
        lines = [line for line in lines if not line.startswith("quickdraft: load")]
        assert code not in (0, None), (argv, captured)
        assert len(lines) == 1, (argv, captured.err)
        assert "Traceback" not in captured.err + captured.out, argv


def test_the_installed_command_exits_with_one_line_and_no_traceback(tmp_path):
    """The same through a real process: exit codes and stderr as a shell sees them."""
    for argv, code in (
        (["generate", "hi", "-k", "0"], 2),
        (["generate", "hi", "--method", "eagle", "--tree", "1000000,1,1"], 2),
        (["conformance", "--alpha", "nan"], 2),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "quickdraft.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == code, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_ctrl_c_ends_a_command_with_one_line_and_code_130(monkeypatch, capsys):
    import quickdraft.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_conformance", interrupted)
    assert cli.main(["conformance"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_serve_on_a_taken_port_fails_before_loading_anything():
    """The port is checked first: one line naming --port in seconds, not after a model load
    (the alias given here would otherwise be converted and loaded)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "quickdraft.cli", "serve", "--target", "qwen2.5-coder-1.5b",
             "--port", str(port), "--speculative-config", '{"method": "ar"}'],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
    assert time.monotonic() - start < 60
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0] and str(port) in lines[0], done.stderr
    assert "loading" not in done.stderr


def test_generate_whose_grammar_fails_mid_output_exits_2(monkeypatch, capsys):
    """A grammar the library stops following past its first tokens (its per-step limits)
    makes no result: one line naming the constraint and exit 2, not its text and 0."""
    from quickdraft.constraints import matcher

    advance = matcher.Matcher.advance

    def counting(self, tokens):
        taken = advance(self, tokens)
        self.walked = getattr(self, "walked", 0) + taken
        return taken

    monkeypatch.setattr(matcher.Matcher, "advance", counting)
    monkeypatch.setattr(
        matcher.Matcher,
        "error",
        property(lambda self: "a limit" if getattr(self, "walked", 0) > 8 else None),
    )
    argv = ["generate", "hi", "--max-new-tokens", "30", "--method", "ar", "--regex", "[a-z ]+"]
    assert main([*argv, "--temperature", "0"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("quickdraft: load")]
    assert len(lines) == 1 and "regex" in lines[0] and "could not follow" in lines[0], lines

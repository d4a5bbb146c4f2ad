"""What quickdraft prints for other serving engines uses only what those engines define.

The lists below were read from the engines' sources (no engine runs on these machines):

- vLLM ``--speculative-config`` keys and methods: ``vllm/config/speculative.py`` of
  vllm-project/vllm at f19b16d95e4395790661f4835e4436bc3dd5d9c7 (``SpeculativeConfig``'s
  user fields; ``SpeculativeMethod``). ``draft_model`` must be named (the code raises on an
  undetected method), and ``disable_by_batch_size`` must be at least 2 (``_verify_args``).
- SGLang flags: ``docs/advanced_features/server_arguments.md`` of sgl-project/sglang at
  004813e1dd464844bd92ddbca5cab8c024a75f78 ("Speculative decoding"), the same flags in
  ``python/sglang/srt/server_args.py`` (BBuf/sglang at 0a6356ae56187a7977bdbe6df3a9016b23ae32a1);
  ``--speculative-algorithm`` choices EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM. SGLang has no
  Medusa and neither engine has lookahead decoding.
"""

import json
import shlex

from quickdraft import engines, methods
from quickdraft.methods import PickContext

VLLM_KEYS = {
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "quantization", "max_model_len", "revision", "code_revision", "disable_by_batch_size",
    "disable_padded_drafter_batch", "prompt_lookup_max", "prompt_lookup_min",
    "speculative_token_tree", "parallel_drafting", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config",
}  # fmt: skip
VLLM_METHODS = {
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp",
    "ngram_gpu",
}  # fmt: skip
VLLM_NEED_MODEL = {"eagle", "eagle3", "medusa", "mlp_speculator", "draft_model"}
SGLANG_FLAGS = {
    "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-draft-model-revision", "--speculative-draft-load-format",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--speculative-accept-threshold-single", "--speculative-accept-threshold-acc",
    "--speculative-token-map", "--speculative-attention-mode",
    "--speculative-ngram-min-bfs-breadth", "--speculative-ngram-max-bfs-breadth",
    "--speculative-ngram-match-type", "--speculative-ngram-max-trie-depth",
    "--speculative-ngram-capacity",
}  # fmt: skip
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}
SGLANG_NEED_DRAFT = {"EAGLE3", "STANDALONE"}


def check_vllm_config(config: dict) -> None:
    assert set(config) <= VLLM_KEYS, set(config) - VLLM_KEYS
    assert config["method"] in VLLM_METHODS
    assert ("model" in config) == (config["method"] in VLLM_NEED_MODEL)
    assert (
        isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] > 0
    )
    if "disable_by_batch_size" in config:
        assert config["disable_by_batch_size"] >= 2
    json.dumps(config)  # it is JSON as it stands


def check_sglang_flags(flags: list[str]) -> None:
    assert len(flags) % 2 == 0  # every flag here takes a value
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert set(pairs) <= SGLANG_FLAGS, set(pairs) - SGLANG_FLAGS
    assert pairs["--speculative-algorithm"] in SGLANG_ALGORITHMS
    needs = pairs["--speculative-algorithm"] in SGLANG_NEED_DRAFT
    assert needs <= ("--speculative-draft-model-path" in pairs)
    for name in ("--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens"):  # fmt: skip
        if name in pairs:
            assert int(pairs[name]) > 0


def test_every_candidate_of_every_method_prints_configs_the_engines_define(tmp_path):
    context = PickContext(target="smollm2-135m", draft="org/draft", export_dir=tmp_path)
    seen = set()
    for entry in methods.entries():
        if entry.pick is None or entry.pick.engines is None:
            continue
        for label, spec in entry.pick.candidates(context):
            for config in entry.pick.engines(spec, context):
                assert config.engine in engines.ENGINES
                if config.speculative is None:  # unsupported: said, with the reason
                    assert config.note and config.command("t") is None
                    continue
                seen.add((entry.name, config.engine))
                if config.engine == "vllm":
                    if config.speculative:
                        check_vllm_config(config.speculative)
                    command = config.command("/models/target")
                    assert command.startswith("vllm serve /models/target"), label
                else:
                    if config.speculative:
                        check_sglang_flags(config.speculative)
                    command = config.command("/models/target")
                    assert shlex.split(command)[:4] == [
                        "python",
                        "-m",
                        "sglang.launch_server",
                        "--model-path",
                    ]
    assert {("draft_model", "vllm"), ("draft_model", "sglang"), ("ngram", "vllm"),
            ("ngram", "sglang"), ("eagle", "vllm"), ("eagle", "sglang")} <= seen  # fmt: skip

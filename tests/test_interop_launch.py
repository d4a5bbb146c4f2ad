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
- llama.cpp's ``llama-server`` flags: ``common/arg.cpp`` and ``common/speculative.cpp``
  (``common_speculative_type_from_name_map``) of the llama.cpp inside llama-cpp-python 0.3.36.
  It has no Medusa, no EAGLE-1 and no lookahead; its EAGLE-3 draft is a GGUF
  (``tests/test_eagle_gguf.py``).
"""

import json
import shlex

import torch

from quickdraft.drafters import registry
from quickdraft.interop import launch
from quickdraft.interop.launch import launch_configs
from quickdraft.pick.candidates import support
from quickdraft.pick.context import PickContext

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
LLAMA_FLAGS = {
    "--spec-draft-model", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
    "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", "--spec-ngram-simple-min-hits",
}  # fmt: skip
LLAMA_TYPES = {
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
}  # fmt: skip
LLAMA_NEED_DRAFT = {"draft-simple", "draft-eagle3"}
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


def check_llama_flags(flags: list[str]) -> None:
    assert len(flags) % 2 == 0  # every flag here takes a value
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert set(pairs) <= LLAMA_FLAGS, set(pairs) - LLAMA_FLAGS
    assert pairs["--spec-type"] in LLAMA_TYPES
    assert (pairs["--spec-type"] in LLAMA_NEED_DRAFT) == ("--spec-draft-model" in pairs)
    if "--spec-draft-model" in pairs:
        assert pairs["--spec-draft-model"].endswith(".gguf")
    for name, value in pairs.items():
        if name.startswith("--spec-ngram") or name.startswith("--spec-draft-n"):
            assert 1 <= int(value) <= 1024


def test_every_candidate_of_every_method_prints_configs_the_engines_define(tmp_path):
    context = PickContext(target="smollm2-135m", draft="org/draft", export_dir=tmp_path)
    seen = set()
    for entry in registry.entries():
        for label, spec in support(entry.name).candidates(context):
            for config in launch_configs(spec, context):
                assert config.engine in launch.ENGINES
                if config.speculative is None:  # unsupported: said, with the reason
                    assert config.note and config.command("t") is None
                    continue
                seen.add((entry.name, config.engine))
                if config.engine == "vllm":
                    if config.speculative:
                        check_vllm_config(config.speculative)
                    command = config.command("/models/target")
                    assert command.startswith("vllm serve /models/target"), label
                elif config.engine == "llama.cpp":
                    if config.speculative:
                        check_llama_flags(config.speculative)
                    command = shlex.split(config.command("/models/target"))
                    assert command[:2] == ["llama-server", "-m"], label
                    assert command[2].endswith(".gguf") and command[2] == config.model
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
            ("ngram", "sglang"), ("eagle", "vllm"), ("eagle", "sglang"),
            ("draft_model", "llama.cpp"), ("ngram", "llama.cpp"),
            ("eagle", "llama.cpp"), ("suffix", "vllm")} <= seen  # fmt: skip


def _layer(prefix: str, h: int, inner: int, q: int, kv: int, width: int) -> dict:
    """A decoder layer's checkpoint names and shapes: attention over ``width`` inputs."""
    return {
        f"{prefix}self_attn.q_proj.weight": (q, width),
        f"{prefix}self_attn.k_proj.weight": (kv, width),
        f"{prefix}self_attn.v_proj.weight": (kv, width),
        f"{prefix}self_attn.o_proj.weight": (h, q),
        f"{prefix}mlp.gate_proj.weight": (inner, h),
        f"{prefix}mlp.up_proj.weight": (inner, h),
        f"{prefix}mlp.down_proj.weight": (h, inner),
        f"{prefix}post_attention_layernorm.weight": (h,),
    }


def loader_names(engine: str, variant: str, config) -> tuple[dict, set[str]]:
    """(names the engine's loader reads -> shapes, the names among them it cannot do without),
    for a one-layer Llama drafter of ``config`` (``EagleConfig``). Read from (file @ commit):

    - vLLM EAGLE-3: ``vllm/model_executor/models/llama_eagle3.py`` @ 00bd1493b3e8
      (``Eagle3LlamaForCausalLM.load_weights``: ``midlayer.`` -> ``layers.0.``, ``d2t`` ->
      ``draft_id_to_target_id``, ``t2d`` skipped, ``fc`` without bias, unknown names raise);
    - vLLM EAGLE-1: ``vllm/model_executor/models/llama_eagle.py`` @ e1c4a55214c6
      (layer 0 has no ``input_layernorm``; ``fc`` [H, 2H] without bias; the target's head);
    - SGLang EAGLE-3: ``python/sglang/srt/models/llama_eagle3.py`` @ d737979cbd17
      (only ``midlayer.*`` matches, ``layers.0.*`` is dropped silently; ``d2t`` -> hot ids);
    - SGLang EAGLE-1: ``python/sglang/srt/models/llama_eagle.py`` @ 3b64d5dee075
      (``fc`` has a bias by default, left random if the checkpoint lacks it; layer 0 without
      ``input_layernorm``; a checkpoint ``lm_head`` is ignored).
    """
    h, inner = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    if variant == "eagle3":
        names = {
            "fc.weight": (h, 3 * h), "norm.weight": (h,),
            "lm_head.weight": (config.draft_vocab_size, h), "d2t": (config.draft_vocab_size,),
            "t2d": (config.vocab_size,),
            **_layer("midlayer.", h, inner, q, kv, 2 * h),
            "midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
        }  # fmt: skip
        required = set(names) - {"d2t", "t2d"}
        return names, required
    names = {"fc.weight": (h, 2 * h), **_layer("layers.0.", h, inner, q, kv, h)}
    if engine == "sglang":
        names["fc.bias"] = (h,)
    return names, set(names)


def test_exported_eagle_tensors_are_the_names_each_loader_reads(tmp_path):
    """Every tensor an export writes is one the engine's loader reads, with its shape, and
    nothing a loader needs is missing: SGLang drops names it does not know without a word,
    so a renaming slip would serve random weights."""
    from safetensors.torch import load_file

    from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
    from quickdraft.interop.eagle_export import export_eagle

    for variant in ("eagle1", "eagle3"):
        config = EagleConfig(
            variant=variant, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2,
            head_dim=16, vocab_size=300, draft_vocab_size=120,
            feature_layers=(1, 2, 3) if variant == "eagle3" else (),
        )  # fmt: skip
        net = EagleNet(config)
        net.draft_vocab = torch.randperm(300)[:120]
        head = torch.randn(300, 64)
        for engine in ("vllm", "sglang"):
            folder = export_eagle(net, head, tmp_path / f"{variant}-{engine}", engine)
            weights = load_file(folder / "model.safetensors")
            names, required = loader_names(engine, variant, config)
            written = {name: tuple(t.shape) for name, t in weights.items()}
            assert set(written) <= set(names), (variant, engine, set(written) - set(names))
            assert required <= set(written), (variant, engine, required - set(written))
            for name, shape in written.items():
                assert shape == names[name], (variant, engine, name)
            config_json = json.loads((folder / "config.json").read_text())
            if variant == "eagle3":  # each engine's own key for the fused layers
                assert config_json["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM
                assert config_json["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
                    0,
                    1,
                    2,
                ]  # SGLang adds one
            else:  # the draft vocabulary: SGLang's --speculative-token-map, a 1-D id tensor
                ids = torch.load(folder / "token_map.pt", weights_only=True)
                assert ids.dim() == 1
                assert sorted(ids.tolist()) == sorted(net.draft_vocab.tolist())


def test_exported_medusa_heads_are_the_names_vllms_loader_reads(tmp_path):
    """vLLM's Medusa (``vllm/model_executor/models/medusa.py`` @ 09cddad8f032 and its
    ``transformers_utils/configs/medusa.py``): ``blocks.{h}.layers.{l}.weight`` [H, H] with a
    ``.bias`` when ``medusa_fc_bias``, ``lm_heads.{h}.weight`` [truncated_vocab_size, H] and
    ``token_map`` when the vocabulary is truncated; unknown names are ignored silently, so each
    written one is checked here. ``model_type: "medusa"`` is how vLLM detects the method."""
    from safetensors.torch import load_file

    from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads
    from quickdraft.interop.medusa_export import export_medusa

    hidden, vocab = 32, 200
    head = torch.randn(vocab, hidden)
    for own, rows in ((False, None), (True, torch.randperm(vocab)[:50])):
        config = MedusaConfig(hidden, vocab, num_heads=3, num_layers=2, own_head=own)
        heads = MedusaHeads(config, head)
        heads.vocab = rows
        folder = export_medusa(heads, head, tmp_path / f"own-{own}")
        record = json.loads((folder / "config.json").read_text())
        assert record["model_type"] == "medusa" and record["architectures"] == ["MedusaModel"]
        truncated = record["truncated_vocab_size"]
        assert truncated == (vocab if rows is None else 50)
        names = {"token_map": (truncated,)} if rows is not None else {}
        for h in range(record["num_heads"]):
            names[f"lm_heads.{h}.weight"] = (truncated, hidden)
            for layer in range(record["num_hidden_layers"]):
                names[f"blocks.{h}.layers.{layer}.weight"] = (hidden, hidden)
                if record["medusa_fc_bias"]:
                    names[f"blocks.{h}.layers.{layer}.bias"] = (hidden,)
        written = {k: tuple(v.shape) for k, v in load_file(folder / "model.safetensors").items()}
        assert written == names
        weights = load_file(folder / "model.safetensors")
        expected = head if rows is None else head[rows]
        if not own:  # heads that score the target's rows carry those rows
            assert torch.equal(weights["lm_heads.0.weight"], expected.half())
        check_vllm_config({"method": "medusa", "model": str(folder), "num_speculative_tokens": 3})


def test_shortlists_export_as_sglang_token_maps(tmp_path, capsys):
    """FR-Spec lists and a DynaSpec artifact's core as ``--speculative-token-map`` files: what
    SGLang's ``load_token_map`` reads (``torch.load(..., weights_only=True)`` of token ids;
    ``python/sglang/srt/speculative/spec_utils.py`` @ 2dd501d14955)."""
    from quickdraft.cli import main
    from quickdraft.vocab.shortlist import load_ranked, save_clusters, save_frequency

    save_frequency(tmp_path, torch.rand(500), {})
    assignment = torch.arange(500) % 4
    assignment[load_ranked(tmp_path)[:30]] = -1
    save_clusters(tmp_path, assignment, {})
    assert main(["export", "token-map", "--shortlist-dir", str(tmp_path), "--fr", "64",
                 "--out", str(tmp_path / "fr")]) == 0  # fmt: skip
    ids = torch.load(tmp_path / "fr" / "token_map.pt", weights_only=True)
    assert ids.dtype == torch.int64 and set(ids.tolist()) == set(
        load_ranked(tmp_path)[:64].tolist()
    )
    assert main(["export", "token-map", "--shortlist-dir", str(tmp_path), "--core",
                 "--out", str(tmp_path / "core")]) == 0  # fmt: skip
    core = torch.load(tmp_path / "core" / "token_map.pt", weights_only=True)
    assert set(core.tolist()) == set(torch.nonzero(assignment == -1).flatten().tolist())
    assert "--speculative-token-map" in capsys.readouterr().out
    assert (
        main(
            [
                "export",
                "token-map",
                "--shortlist-dir",
                str(tmp_path),
                "--fr",
                "9999",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )

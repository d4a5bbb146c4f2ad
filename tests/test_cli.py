import json

import pytest

from quickdraft.cli import main
from quickdraft.drafters import registry


def test_demo_runs_and_prints_statistics(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("mean accepted length") == 4 and "target forwards" in out


def test_bad_arguments_exit_with_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--samples", "0"])
    assert exit_info.value.code == 2
    assert "--samples" in capsys.readouterr().err


def test_invalid_cost_is_reported_not_raised(tmp_path, capsys):
    assert main(["theory", "--out", str(tmp_path), "--draft-cost", "-1"]) == 2
    assert "draft_cost" in capsys.readouterr().err


def test_generate_json_output(smollm2, capsys):
    import json

    code = main(
        [
            "generate",
            "def add(a, b):",
            "--max-new-tokens",
            "12",
            "--json",
            "--method",
            "ngram",
            "-k",
            "3",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["token_ids"]) == 12 and isinstance(data["text"], str)
    assert data["stats"]["k"] == 3 and data["stats"]["new_tokens"] == 12


def test_generate_for_people_marks_drafts_and_prints_one_stats_line(smollm2, capsys):
    code = main(
        [
            "generate",
            "1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2,",
            "--max-new-tokens",
            "16",
            "--stream",
            "--method",
            "ngram",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "mean accepted length" in out and "target forwards" in out and "ngram, k=5" in out


def test_generate_rejects_inconsistent_arguments(capsys):
    assert main(["generate", "x", "--method", "ngram", "--draft", "smollm2-135m"]) == 2
    assert "draft" in capsys.readouterr().err
    assert main(["generate", "x", "--temperature", "-1", "--max-new-tokens", "2"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_auto_method_is_eagle_where_a_drafter_ships_else_prompt_lookup(tmp_path):
    from quickdraft.cli.common import auto_method as auto

    assert auto("smollm2-135m") == "eagle"
    assert auto("smollm2-135m", backend="hf") == "ngram"  # EAGLE reads the native runner
    assert auto("smollm2-135m", draft="smollm2-135m") == "draft_model"
    assert auto(str(tmp_path)) == "ngram"  # a folder, even one that exists, has none shipped
    # Their drafters ship and beat prompt lookup in the seven-task bench and on held-out prompts.
    assert auto("qwen2.5-coder-1.5b") == "eagle"
    assert auto("qwen2.5-coder-0.5b") == "eagle"


def test_an_eagle_drafter_runs_with_its_own_shortlist_unless_one_is_asked_for(tmp_path):
    """One rule for the Python API, the command line and the server: the builder resolves the
    option, so ``make_spec("eagle")`` and ``quickdraft generate --method eagle`` agree."""
    from quickdraft.artifacts import ArtifactError
    from quickdraft.drafters.eagle.io import CONFIG_FILE, eagle_folder, shortlist_choice

    def own(target: str, folder: str | None = None, **options) -> str:
        spec = registry.make_spec("eagle", **options)
        return str(shortlist_choice(spec.options.draft_shortlist, eagle_folder(target, folder)))

    assert own("smollm2-135m") == "full"  # its config names none
    assert own("qwen2.5-coder-0.5b") == "full"  # its own 16,384 rows: it trained on them
    assert own("qwen2.5-coder-0.5b", draft_shortlist="full") == "full"  # asked for
    assert own("qwen2.5-coder-0.5b", draft_shortlist="dyna-pa:4") == "dyna-pa:4"
    shipped = json.loads((eagle_folder("smollm2-135m") / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**shipped, "shortlist": "dyna-pa:4"}))
    assert own("smollm2-135m", str(tmp_path)) == "dyna-pa:4"
    for wrong in ("top:3", 4):
        (tmp_path / CONFIG_FILE).write_text(json.dumps({**shipped, "shortlist": wrong}))
        with pytest.raises(ArtifactError, match=f"{CONFIG_FILE}.*'shortlist'"):
            own("smollm2-135m", str(tmp_path))


def test_an_eagle_drafter_grows_its_own_tree_unless_one_is_asked_for(tmp_path):
    """A drafter's eagle.json may name its tree per device and its grafted lookup tokens (a
    sweep measured them); options given win, a device it names nothing for gets the default,
    and a bad entry is one line naming the file and the field."""
    from quickdraft.artifacts import ArtifactError
    from quickdraft.drafters.eagle.io import CONFIG_FILE, eagle_folder, tree_choice
    from quickdraft.drafters.eagle.tree import DEFAULT_LOOKUP, DEFAULT_TREES, DynamicTree

    def chosen(folder, device="cpu", **options):
        spec = registry.make_spec("eagle", **options)
        return tree_choice(spec.options.tree, spec.options.eagle_lookup, folder, device)

    shipped = json.loads((eagle_folder("smollm2-135m") / CONFIG_FILE).read_text())
    assert chosen(eagle_folder("smollm2-135m")) == (DEFAULT_TREES["cpu"], DEFAULT_LOOKUP)
    own = {**shipped, "tree": {"cpu": "8,4,16,0.05"}, "lookup": 3}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(own))
    assert chosen(tmp_path) == (DynamicTree(8, 4, 16, 0.05), 3)
    assert chosen(tmp_path, "cuda") == (DEFAULT_TREES["cuda"], 3)
    assert chosen(tmp_path, tree="4,2,6", eagle_lookup=0) == (DynamicTree(4, 2, 6), 0)
    assert chosen(tmp_path, eagle_lookup=1) == (DynamicTree(8, 4, 16, 0.05), 1)
    for field, wrong in (("tree", "8,4"), ("tree", ["8,4,16"]), ("lookup", -1), ("lookup", "3")):
        (tmp_path / CONFIG_FILE).write_text(json.dumps({**own, field: wrong}))
        with pytest.raises(ArtifactError, match=f"{CONFIG_FILE}.*'{field}'"):
            chosen(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**own, "tree": {"cpu": "8,8,250"}}))
    with pytest.raises(ValueError, match="exceed"):
        chosen(tmp_path, eagle_lookup=10)


def test_a_drafter_is_held_back_from_auto_only_by_its_config(tmp_path):
    from quickdraft.artifacts import ArtifactError
    from quickdraft.drafters.eagle.io import CONFIG_FILE, eagle_folder, offered_by_auto

    shipped = json.loads((eagle_folder("smollm2-135m") / CONFIG_FILE).read_text())
    assert offered_by_auto(eagle_folder("smollm2-135m")) and "auto" not in shipped
    assert not offered_by_auto(tmp_path)  # no drafter at all
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**shipped, "auto": False}))
    assert not offered_by_auto(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**shipped, "auto": "no"}))
    with pytest.raises(ArtifactError, match="auto"):
        offered_by_auto(tmp_path)


def test_progress_in_a_log_is_a_line_a_minute_with_the_time_left(monkeypatch):
    """A background run's output goes to a file, where rich draws no bar: progress comes as
    plain lines (a stage's first report, one a minute, its last), and none on a terminal."""
    import io

    from rich.console import Console

    from quickdraft.cli import common

    clock = iter([0.0, 30.0, 61.0, 62.0, 90.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    lines = common.LogLines(Console(file=out, width=200))
    for done in (0, 5, 10, 11, 20):  # at 0 s, 30 s, 61 s, 62 s and 90 s
        lines("draft layer", done, 20)
    assert out.getvalue().splitlines() == [
        "draft layer: 0/20",
        "draft layer: 10/20 (50%), about 61 s left",  # 10 steps in 61 s: 10 more in 61 s
        "draft layer: 20/20 (100%)",
    ]
    # A pause (SIGSTOP) slows the line after it, not every line after that.
    clock = iter([0.0, 600.0, 661.0])
    paused = io.StringIO()
    lines = common.LogLines(Console(file=paused, width=200))
    for done in (0, 10, 20):
        lines("draft layer", done, 40)
    assert paused.getvalue().splitlines()[-1] == "draft layer: 20/40 (50%), about 2 min left"
    terminal = io.StringIO()
    live = common.LogLines(Console(file=terminal, force_terminal=True))
    live("draft layer", 0, 20)
    assert terminal.getvalue() == ""

import math

import pytest

from quickdraft.config import AcceptRule, Method, SamplingParams, SpecConfig
from quickdraft.drafters.registry import make_spec


def test_defaults_are_valid_and_frozen():
    params = SamplingParams()
    spec = SpecConfig()
    assert params.temperature == 1.0 and spec.method is Method.DRAFT_MODEL
    with pytest.raises(AttributeError):
        params.temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1.0"),
        ("temperature", True),
        ("temperature", None),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", math.nan),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", -0.5),
        ("top_p", 1.01),
        ("top_p", math.nan),
        ("top_p", math.inf),
        ("top_p", "0.9"),
        ("max_new_tokens", 0),
        ("max_new_tokens", -3),
        ("max_new_tokens", 1.5),
        ("max_new_tokens", math.inf),
        ("seed", -1),
        ("seed", 1.0),
        ("seed", "7"),
        ("stop_token_ids", (1, -2)),
        ("stop_token_ids", (1.5,)),
        ("stop_token_ids", 3),
        ("stop_token_ids", "12"),
        ("stop", ("",)),
        ("stop", (3,)),
        ("stop", "end"),
        ("draft_steps", 1),
        ("draft_steps", "yes"),
    ],
)
def test_sampling_params_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_speculative_tokens", 0),
        ("num_speculative_tokens", 65),
        ("num_speculative_tokens", -1),
        ("num_speculative_tokens", 4.0),
        ("num_speculative_tokens", math.nan),
        ("num_speculative_tokens", True),
        ("method", "medusa9"),
        ("method", 3),
        ("acceptance", "typical-ish"),
        ("draft_temperature", -1.0),
        ("draft_temperature", math.inf),
        ("draft_temperature", "hot"),
    ],
)
def test_spec_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_spec(**{field: value})


def test_enums_accept_their_string_values():
    spec = SpecConfig(method="ar", acceptance="greedy", num_speculative_tokens=64)
    assert spec.method is Method.AR and spec.acceptance is AcceptRule.GREEDY
    assert spec.k == 0
    assert SpecConfig(num_speculative_tokens=1).k == 1


def test_draft_temperature_only_for_draft_model():
    with pytest.raises(ValueError, match="draft_temperature"):
        make_spec(method=Method.AR, draft_temperature=0.5)
    assert make_spec(draft_temperature=0.0).options.draft_temperature == 0.0


def test_lists_become_tuples():
    params = SamplingParams(stop_token_ids=[2, 5], stop=["\n\n"])
    assert params.stop_token_ids == (2, 5) and params.stop == ("\n\n",)
    assert SamplingParams(temperature=0).greedy

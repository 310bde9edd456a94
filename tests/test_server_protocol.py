"""OpenAI request bodies → what the engine runs: defaults, roles, content parts, extensions."""
import pytest

from engine import SamplingParams
from engine.server.protocol import ApiError, parse_chat, parse_completion

DEFAULTS = SamplingParams(temperature=0.3, top_p=0.8, top_k=20, max_tokens=99, seed=0)


def test_omitted_fields_take_the_engine_defaults_and_the_context_as_the_limit():
    job = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, DEFAULTS, context=2048)
    sp = job.sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.stop) == (0.3, 0.8, 20, 2048, [])
    assert not job.stream and not job.include_usage and job.model is None


def test_no_seed_draws_a_fresh_one_and_a_given_seed_is_kept():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    seeds = {parse_chat(body, DEFAULTS, 64).sampling.seed for _ in range(8)}
    assert len(seeds) == 8
    assert parse_chat({**body, "seed": -3}, DEFAULTS, 64).sampling.seed == -3


def test_roles_content_parts_and_extensions():
    job = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "name": "bot"}],
        "top_k": -1, "ignore_eos": True, "stop": "END", "stream": True,
        "stream_options": {"include_usage": True}}, DEFAULTS, 64)
    assert job.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                            {"role": "assistant", "content": ""}]
    assert job.sampling.top_k == 0 and job.sampling.ignore_eos and job.sampling.stop == ["END"]
    assert job.stream and job.include_usage and job.model == "m"


def test_continue_final_message_needs_the_reply_last_and_no_generation_prompt():
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    job = parse_chat({"messages": said, "continue_final_message": True, "add_generation_prompt": False}, DEFAULTS, 64)
    assert job.continue_final and job.messages[-1] == {"role": "assistant", "content": "Hel"}
    assert not parse_chat({"messages": said}, DEFAULTS, 64).continue_final
    for body, param in [({"messages": said, "continue_final_message": True}, "add_generation_prompt"),
                        ({"messages": said[:1], "continue_final_message": True, "add_generation_prompt": False},
                         "messages"),
                        ({"messages": said, "continue_final_message": "yes"}, "continue_final_message")]:
        with pytest.raises(ApiError) as e:
            parse_chat(body, DEFAULTS, 64)
        assert e.value.status == 400 and e.value.param == param


def test_completion_prompts():
    assert parse_completion({"prompt": "x"}, DEFAULTS, 64).prompt == "x"
    assert parse_completion({"prompt": ["x"]}, DEFAULTS, 64).prompt == "x"
    assert parse_completion({"prompt": [[5, 6]]}, DEFAULTS, 64).prompt_ids == [5, 6]
    with pytest.raises(ApiError) as e:
        parse_completion({"prompt": [5, "a"]}, DEFAULTS, 64)
    assert e.value.status == 400 and e.value.param == "prompt"


def test_errors_have_openais_shape():
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, DEFAULTS, 64)
    assert e.value.body() == {"error": {"message": "top_p must be a number in (0, 1]", "type": "invalid_request_error",
                                        "param": "top_p", "code": None}}

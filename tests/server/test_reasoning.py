"""A think block returned as `reasoning_content` (`server/reasoning.py`), and chat template
variables (`chat_template_kwargs`, Qwen3's `enable_thinking`): the split of whole and streamed
outputs; over HTTP on the tiny model with a Qwen3-like template, a prompt that opens the block
gets its whole (cut off) output as reasoning, one whose template closes it (thinking off) gets
content, streamed as returned whole; reserved template variables are 400s."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from inflight import LLM, SamplingParams
from inflight.engine.async_engine import AsyncLLM
from inflight.server import reasoning
from inflight.server.api_server import ServerConfig
from inflight.server.tool_parsers import template_text
from tests.server.live import LiveServer

# Qwen3's template's thinking switch, on the tiny tokenizer's ChatML (`enable_thinking` false
# closes an empty block in the prompt; true leaves the output to open one, as Qwen3 does); and
# a template that forces thinking by opening the block in the prompt, as DeepSeek-R1's does
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif force_thinking is defined and force_thinking %}<think>\n{% endif %}{% endif %}"
)

# (output, whether the prompt opened the block, reasoning, content)
CASES = [
    ("<think>\nThe user greets.\n</think>\n\nHello!", False, "\nThe user greets.\n", "Hello!"),
    ("Hello!", False, "", "Hello!"),  # thinking off: no block in the output
    ("The user greets.\n</think>\n\nHello!", True, "The user greets.\n", "Hello!"),
    ("<think>\nStill thinking when cut", False, "\nStill thinking when cut", ""),
    ("Cut while thinking", True, "Cut while thinking", ""),
    ("  <thinking about it> no", False, "", "  <thinking about it> no"),
]


@pytest.mark.parametrize(("text", "opened", "thought", "content"), CASES)
def test_the_split_whole_and_streamed(text, opened, thought, content):
    assert reasoning.split_reasoning(text, opened, final=True) == (thought, content)
    stream = reasoning.ReasoningStream(opened)
    got_thought = got_content = ""
    for end in range(1, len(text) + 1):  # a character at a time: each part only grows
        new_thought, new_content, so_far = stream.feed(text[:end], end == len(text))
        got_thought += new_thought
        got_content += new_content
        assert so_far == got_content
    assert (got_thought, got_content) == (thought, content)


@pytest.mark.parametrize(("text", "opened", "thought", "content"), CASES)
def test_reasoning_tokens_are_those_up_to_the_closing_tag(tiny_llama, text, opened, thought,
                                                          content):  # fmt: skip
    """The shortest prefix of the output's tokens whose text closes the block; all of them for a
    block cut off, none without one (the tiny tokenizer spells the tags in several tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    n = reasoning.reasoning_tokens(tokenizer, ids, opened)
    closes = lambda k: reasoning.THINK_CLOSE in tokenizer.decode(ids[:k])  # noqa: E731
    if not thought and not opened:
        assert n == 0
    elif not content:
        assert n == len(ids)
    else:
        assert closes(n) and not closes(n - 1) and 1 < n < len(ids)


def test_the_parser_is_chosen_from_the_template():
    assert reasoning.choose(QWEN3_LIKE) == "think"
    assert reasoning.choose(template_text({"default": "x", "thinking": "</think>"})) == "think"
    assert reasoning.choose("{{ messages }}") == reasoning.choose(template_text(None)) == "none"
    assert reasoning.prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not reasoning.prompt_opens_thinking("<think>\n\n</think>\n\n")
    with pytest.raises(ValueError, match="unknown reasoning_parser 'deepseek'"):
        ServerConfig(reasoning_parser="deepseek")


@pytest.fixture(scope="module")
def thinking_model(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("thinking")
    shutil.copytree(tiny_llama, folder, dirs_exist_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3_LIKE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def test_template_variables_reach_the_template(thinking_model):
    llm = LLM(str(thinking_model), dtype="float32", max_model_len=256, num_kv_blocks=64)
    off = llm.render_chat([{"role": "user", "content": "hi"}],
                          template_kwargs={"enable_thinking": False})  # fmt: skip
    assert off.endswith("<think>\n\n</think>\n\n")
    assert not llm.render_chat([{"role": "user", "content": "hi"}]).endswith("</think>\n\n")
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    (out,) = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=False,
                      chat_template_kwargs={"force_thinking": True})  # fmt: skip
    assert out.prompt.endswith("<think>\n")


@pytest.fixture(scope="module")
def server(thinking_model):
    engine = AsyncLLM(str(thinking_model), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:  # reasoning parser: auto
        yield s


def chat(server, stream=False, **body):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "stream": stream, **body}  # fmt: skip
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def _streamed(response) -> tuple[str, str]:
    thought = content = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                thought += choice["delta"].get("reasoning_content") or ""
                content += choice["delta"].get("content") or ""
    return thought, content


def test_thinking_is_returned_apart_from_the_answer_over_http(server):
    forced = chat(server, chat_template_kwargs={"force_thinking": True})
    assert forced.status_code == 200, forced.text
    message = forced.json()["choices"][0]["message"]
    # the output never closes the block (cut off at 8 tokens): all of it is reasoning
    assert message["reasoning_content"] and not message["content"]
    assert forced.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 8
    off = chat(server, chat_template_kwargs={"enable_thinking": False})
    message = off.json()["choices"][0]["message"]
    assert message["content"] and message.get("reasoning_content") is None
    assert off.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    streamed = chat(server, stream=True, chat_template_kwargs={"force_thinking": True})
    assert _streamed(streamed) == (forced.json()["choices"][0]["message"]["reasoning_content"], "")


@pytest.mark.parametrize("key", ["messages", "add_generation_prompt", "tools", "tokenize"])
def test_reserved_template_variables_are_400s(server, key):
    response = chat(server, chat_template_kwargs={key: True})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "chat_template_kwargs" and key in error["message"]


def test_lone_surrogates_in_template_variables_are_400s(server):
    """A template may render its variables into the prompt text, which must be valid Unicode
    (as JSON text: the escape a hostile client writes)."""
    body = ('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
            ' "chat_template_kwargs": {"note": ["ok", "\\ud800"]}}')  # fmt: skip
    response = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=60,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "chat_template_kwargs.note.1"
    assert chat(server, chat_template_kwargs={"note": ["ok"]}).status_code == 200


def test_a_streamed_response_thinks_in_reasoning_summary_events(thinking_model, tmp_path):
    """Through the official client, a model whose template always opens the block: cut off at
    8 tokens, everything is a reasoning summary, streamed equal to the whole, marked incomplete."""
    import openai
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    folder = tmp_path / "forced"
    shutil.copytree(thinking_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3_LIKE.replace("force_thinking is defined and force_thinking",
                                                 "true")  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    engine = AsyncLLM(str(folder), dtype="float32", max_model_len=256, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        body = {"model": "tiny", "input": "hi", "max_output_tokens": 8, "temperature": 0}
        whole = client.responses.create(**body)
        with client.responses.stream(**body) as stream:
            events = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump())
                      for e in stream]  # fmt: skip
    (item,) = whole.output
    assert item.type == "reasoning" and item.summary[0].text
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    (part_done,) = [e for e in events if e.type == "response.reasoning_summary_part.done"]
    assert deltas == part_done.part.text == item.summary[0].text
    assert part_done.status == "incomplete" and events[-1].type == "response.incomplete"
    assert whole.usage.output_tokens_details.reasoning_tokens == whole.usage.output_tokens == 8
    assert events[-1].response.output[0].summary[0].text == deltas

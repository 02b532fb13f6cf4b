"""A chat template given in place of the model's own (`chat_template`, vLLM's `--chat-template`):
a model without one chats with it, offline and over HTTP (a Ray gateway takes the engines'); a
path or text that is no template is refused before any weight loads; /metrics names no
template text."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from inflight import LLM, ConfigError, InvalidRequestError, SamplingParams
from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

PLAIN = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def no_template(tiny_llama, tmp_path_factory):
    """The tiny Llama with its tokenizer's chat template taken out (a base model's folder)."""
    folder = tmp_path_factory.mktemp("base")
    shutil.copytree(tiny_llama, folder, dirs_exist_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def test_a_model_without_a_template_chats_with_one_given(no_template, tmp_path):
    with pytest.raises(InvalidRequestError, match=r"no chat template: give .*--chat-template"):
        LLM(str(no_template)).chat(HI, use_tqdm=False)
    (tmp_path / "plain.jinja").write_text(PLAIN)
    for source in (str(tmp_path / "plain.jinja"), PLAIN):  # a file, or the text itself
        llm = LLM(str(no_template), chat_template=source)
        assert llm.render_chat(HI) == "[user] hi\n[assistant] "
        params = SamplingParams(temperature=0, max_tokens=4)
        out = llm.chat(HI, params, use_tqdm=False)[0]
        assert out.prompt_token_ids == llm.tokenizer("[user] hi\n[assistant] ").input_ids


def test_a_given_template_replaces_the_models_own(tiny_llama):
    llm = LLM(str(tiny_llama), chat_template=PLAIN)
    assert llm.render_chat(HI) == "[user] hi\n[assistant] "
    assert "<|im_start|>" in LLM(str(tiny_llama)).render_chat(HI)


@pytest.mark.parametrize(("source", "says"), [
    ("/no/such/template.jinja", "is neither a file nor a Jinja template"),
    ("chatml", "is neither a file nor a Jinja template"),
    ("{% for m in messages %}{{ m['content'] }}", "line 1: Unexpected end of template"),
    ("x" * 5000 + "{{", "line 1"),
    ("{{ 'a' }}\ud800", "character 9 is not valid Unicode"),  # a lone surrogate
])  # fmt: skip
def test_what_is_no_template_is_refused_before_loading(tiny_llama, source, says, monkeypatch):
    from inflight.engine import frontend

    def no_loading(*args, **kwargs):
        raise AssertionError("the engine started loading")

    monkeypatch.setattr(frontend, "EngineCore", no_loading)
    with pytest.raises(ConfigError, match=says):
        LLM(str(tiny_llama), chat_template=source)


def test_http_chat_takes_the_given_template(no_template):
    engine = AsyncLLM(str(no_template), max_model_len=128, num_kv_blocks=64, chat_template=PLAIN)
    with LiveServer(engine, served_model_name="tiny") as server:
        body = {"model": "tiny", "messages": HI, "max_tokens": 3, "temperature": 0}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        prompt = engine.tokenizer("[user] hi\n[assistant] ").input_ids
        assert response.json()["usage"]["prompt_tokens"] == len(prompt)
        metrics = httpx.get(server.url + "/metrics", timeout=60).text
        assert 'chat_template="custom"' in metrics and "[assistant]" not in metrics

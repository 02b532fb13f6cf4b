"""Tenants at the server: the API keys file (its refusals name their line), each request's
tenant from its key, a trusted `x-tenant` header or the `user` field, in that order, and what
`fair` scheduling then counts for each."""

from __future__ import annotations

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from inflight.server.api_server import ServerConfig
from inflight.server.tenants import read_api_keys
from tests.server.live import LiveServer

KEYS = "sk-alpha alpha 2  # the alpha team\nsk-beta beta\n\n# comments and blank lines\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("k1 a\nk1 b\n", 2, "given before"),
        ("k1 a 0\n", 1, "positive finite"),
        ("k1 a -1\n", 1, "positive finite"),
        ("k1 a nan\n", 1, "positive finite"),
        ("k1 a inf\n", 1, "positive finite"),
        ("k1 a two\n", 1, "not a number"),
        ("k1\n", 1, "KEY TENANT"),
        ("k1 a 1 extra\n", 1, "KEY TENANT"),
        ("k1 a 1\nk2 a 2\n", 2, "weight 1.0 before"),
        ("k1 " + "t" * 65 + "\n", 1, "printable"),
        ("# nothing\n", None, "no keys"),
    ],
)
def test_a_bad_keys_file_is_refused_naming_its_line(tmp_path, text, line, words):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ValueError, match=words) as refused:
        read_api_keys(path)
    if line is not None:
        assert f"{path}:{line}:" in str(refused.value)


def test_keys_file_reads_tenants_and_weights(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    assert read_api_keys(path) == ({"sk-alpha": "alpha", "sk-beta": "beta"},
                                   {"alpha": 2.0, "beta": 1.0})  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(KEYS)
    config = ServerConfig(api_keys_file=str(path))
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64,
                      scheduling_policy="fair",
                      tenant_weights=tuple(config.tenancy.weights.items()))  # fmt: skip
    with LiveServer(engine, served_model_name="tiny", api_keys_file=str(path),
                    tenant_from_user=True) as s:  # fmt: skip
        yield s


def complete(server, key: str | None, headers=None, **body):
    headers = {**({"authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(
        server.url + "/v1/completions",
        headers=headers,
        timeout=60,
        json={
            "model": "tiny",
            "prompt": "hello there",
            "max_tokens": 3,
            "ignore_eos": True,
            **body,
        },
    )


def served(server) -> dict[str, int]:
    server.wait_idle()
    return dict(server.engine.core.scheduler.shares.served_tokens)


def test_each_key_is_its_tenant_and_unknown_keys_are_refused(server):
    assert complete(server, "sk-nope").status_code == 401
    assert complete(server, None).status_code == 401
    before = served(server)
    assert complete(server, "sk-alpha").status_code == 200
    after = served(server)
    assert after["alpha"] > before.get("alpha", 0)
    assert after.get("beta", 0) == before.get("beta", 0)
    assert server.engine.core.scheduler.shares.weight("alpha") == 2.0


def test_a_header_is_untrusted_by_default_and_user_names_a_tenant_where_allowed(server):
    before = served(server)
    # the key names the tenant: neither header nor user can change it
    assert complete(server, "sk-beta", {"x-tenant": "alpha"}, user="gamma").status_code == 200
    after = served(server)
    assert after["beta"] > before.get("beta", 0) and "gamma" not in after
    assert after.get("alpha", 0) == before.get("alpha", 0)


def test_user_names_the_tenant_of_a_request_whose_key_names_none(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=32,
                      scheduling_policy="fair")  # fmt: skip
    with LiveServer(engine, served_model_name="tiny", tenant_from_user=True,
                    tenant_header=True) as s:  # fmt: skip
        assert complete(s, None, user="gamma").status_code == 200
        assert complete(s, None, {"x-tenant": "delta"}, user="gamma").status_code == 200
        assert complete(s, None).status_code == 200
        long = complete(s, None, {"x-tenant": "d" * 65})
        assert long.status_code == 400 and long.json()["error"]["param"] == "x-tenant"
        assert set(served(s)) == {"gamma", "delta", "default"}

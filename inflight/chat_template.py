"""A chat template given in place of the model's own (`chat_template` knob, vLLM's
`--chat-template`): its file's path, or the Jinja text itself. Checked when the engine is
configured, before any weight loads, so a wrong path or a syntax error is refused at once; the
config then holds the text, so the file is read once."""

from __future__ import annotations

from pathlib import Path

import jinja2

from inflight.errors import ConfigError

MAX_TEMPLATE_BYTES = 1 << 20  # published templates are a few KiB; this is far beyond any


def chat_template_text(source: str) -> str:
    """The template's text: the file `source` names, or `source` itself where it holds Jinja
    markup; refuses anything else, or a template Jinja cannot parse, naming the problem."""
    path = Path(source)
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long, or with a NUL: not a path
        is_file = False
    if is_file:
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise ConfigError(f"chat_template {source}: over {MAX_TEMPLATE_BYTES} bytes")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"chat_template {source}: cannot read it ({e})") from None
    elif "{{" in source or "{%" in source:
        text = source
    else:
        raise ConfigError(f"chat_template {source[:200]!r} is neither a file nor a Jinja template")
    try:
        text.encode()
    except UnicodeEncodeError as e:  # a lone surrogate: no request could render it
        raise ConfigError(f"chat_template: character {e.start} is not valid Unicode") from None
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"chat_template: line {e.lineno}: {e.message}") from None
    return text

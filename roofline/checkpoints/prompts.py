"""Prompts as the model saw them in training: chat template, generation prompt, one BOS.

Acceptance rates measured on prompts the model was not trained on (no template, a missing
generation prompt, or a doubled BOS) are not the acceptance users will get. The commonest
slip: the template already writes the BOS token as text, and the tokenizer adds another
when it encodes with special tokens. So a prompt is rendered to text once and encoded with
`add_special_tokens=False` (what `apply_chat_template(tokenize=True)` does), and a doubled
BOS at the start is refused.

Which template: transformers reads a standalone `chat_template.jinja` in the checkpoint
folder in preference to the inline `chat_template` of tokenizer_config.json. We do the same,
explicitly, and warn when the two disagree: a checkpoint whose files disagree has usually
had one of them edited, and a reader should know which one was used.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from roofline.io.fields import ConfigError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# what transformers builds a tokenizer from: a `tokenizers` file, or a slow tokenizer's vocabulary
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _inline_template(folder: Path) -> str | None:
    path = folder / TOKENIZER_CONFIG
    if not path.exists():
        return None
    inline = json.loads(path.read_text()).get("chat_template")
    if isinstance(inline, list):  # named templates: [{"name": ..., "template": ...}]
        inline = next((t["template"] for t in inline if t.get("name") == "default"), None)
    return inline


def chat_template(folder) -> str | None:
    """The template a checkpoint folder defines: the standalone file wins over the inline one."""
    folder = Path(folder)
    standalone = folder / TEMPLATE_FILE
    inline = _inline_template(folder)
    if not standalone.exists():
        return inline
    text = standalone.read_text(encoding="utf-8")
    if inline is not None and inline.rstrip("\n") != text.rstrip("\n"):
        warnings.warn(f"{folder.name}: {TEMPLATE_FILE} and the inline chat_template of {TOKENIZER_CONFIG} differ; "
                      f"using {TEMPLATE_FILE}", UserWarning, stacklevel=2)
    return text


def load_tokenizer(folder, field: str = "checkpoint"):
    """The checkpoint's tokenizer with the template `chat_template` chose; a folder without a
    usable tokenizer or template is bad input naming `field` (the option that gave the folder)."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{field}={str(folder)!r}: no such checkpoint folder")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{field}={str(folder)!r}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                          "prompts cannot be encoded as the model saw them")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as e:  # transformers' ways of saying the files are unusable
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{field}={str(folder)!r}: its tokenizer does not load ({type(e).__name__}: {first})") from None
    template = chat_template(folder)
    if template is None:
        raise ConfigError(f"{field}={str(folder)!r}: no chat template ({TEMPLATE_FILE} or chat_template in "
                          f"{TOKENIZER_CONFIG}); prompts cannot be rendered as the model saw them")
    tokenizer.chat_template = template
    return tokenizer


def _check_messages(messages, where: str = "messages") -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: must be a non-empty list of {{role, content}}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ConfigError(f"{where}[{i}]: must be a dict with a string 'role' and a 'content'")
        if not isinstance(m["content"], str):  # a dict or a list would be rendered as Python's repr of it
            raise ConfigError(f"{where}[{i}].content: must be a string (the templates render text), "
                              f"got {type(m['content']).__name__}")
    return messages


def template_line(exc: BaseException) -> int | None:
    """The template line an error happened on: a syntax error carries it; a runtime error
    (raise_exception, an undefined name, a sandbox violation) has it in the traceback frame
    jinja2 rewrites to the template's own line numbers (file name `<template>`)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render(tokenizer, messages, add_generation_prompt: bool = True) -> str:
    """The conversation as the text the model reads, through the checkpoint's template.
    A template that fails (syntax, raise_exception, a sandbox violation, a range past the
    sandbox's limit, an {% include %} with no loader) is bad input: one
    line naming the checkpoint and the template line, never a jinja2 traceback."""
    import jinja2
    messages = _check_messages(messages)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except (jinja2.TemplateError, OverflowError, TypeError) as e:  # SecurityError and UndefinedError are TemplateErrors
        line = template_line(e)
        if not isinstance(e, jinja2.TemplateError) and line is None:
            raise  # raised outside the template (the sandbox's range limit and {% include %} raise inside it)
        where = f" line {line}" if line is not None else ""
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"checkpoint={getattr(tokenizer, 'name_or_path', '?')!r}: chat_template{where}: "
                          f"{type(e).__name__}: {msg}") from None


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of rendered text; the template owns the special tokens, so none are added."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is not None and ids[:2] == [bos, bos]:
        raise ConfigError(f"doubled BOS ({tokenizer.bos_token!r}) at the start of the prompt: the text already held "
                         f"one when the template added its own")
    return ids


def prompt_answer_split(messages) -> tuple[list[dict], dict | None]:
    """(prompt, answer): the answer is the last turn when it is the assistant's, else None."""
    messages = _check_messages(messages)
    if messages[-1]["role"] == "assistant":
        if len(messages) == 1:
            raise ConfigError("messages: an assistant answer needs a prompt before it")
        return messages[:-1], messages[-1]
    return messages, None


def read_conversations(jsonl_path, field: str = "prompts") -> list[list[dict]]:
    """The conversations of a JSONL file ({"messages": [...]} per line); errors name `field`,
    the option the user gave the path as."""
    path = Path(jsonl_path)
    if path.is_dir():
        raise ConfigError(f"{field}={str(jsonl_path)!r}: is a folder; give a JSONL file of conversations")
    if not path.is_file():
        raise ConfigError(f"{field}={str(jsonl_path)!r}: no such file")
    out = []
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first record
    for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path.name} line {n}: not JSON ({e})") from e
        if not isinstance(record, dict):
            raise ConfigError(f"{path.name} line {n}: must be an object with 'messages'")
        out.append(_check_messages(record.get("messages"), f"{path.name} line {n}: messages"))
    if not out:  # N16: an empty file was reported as "no conversation fits max_prompt"
        raise ConfigError(f"{field}={str(jsonl_path)!r}: holds no conversation (an empty file)")
    return out


def encode_conversations(folder, jsonl_path, max_len: int | None = None, field: str = "prompts",
                         max_field: str = "max_prompt") -> list[list[int]]:
    """Prompt ids, one list per conversation, ready for the model to continue.

    A conversation that ends with the assistant's answer is cut before it (prompt_answer_split),
    so the generation prompt follows the last user turn. Prompts longer than max_len are
    skipped with a warning, never truncated: a truncated prompt is not one the model saw."""
    if max_len is not None and max_len < 1:
        raise ConfigError(f"{max_field}={max_len}: must be a positive number of tokens")
    tokenizer = load_tokenizer(folder)
    out, skipped = [], []
    for i, messages in enumerate(read_conversations(jsonl_path, field)):
        prompt, _ = prompt_answer_split(messages)
        ids = encode(tokenizer, render(tokenizer, prompt, add_generation_prompt=True))
        if max_len is not None and len(ids) > max_len:
            skipped.append(i + 1)
            continue
        out.append(ids)
    if skipped:
        warnings.warn(f"{len(skipped)} prompts longer than {max_field}={max_len} tokens skipped (conversations "
                      f"{skipped[:10]}{' ...' if len(skipped) > 10 else ''})", UserWarning, stacklevel=2)
    return out

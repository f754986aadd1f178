"""Prompts reach the model as it was trained: its chat template, a generation prompt, one BOS."""

import json
import warnings

import pytest

from roofline.checkpoints.prompts import encode, encode_conversations, load_tokenizer, prompt_answer_split, render
from tests.helpers import CONVERSATION, TEMPLATE, save_tokenizer

OTHER = ("{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
         "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture
def folder(tmp_path):
    return save_tokenizer(tmp_path / "ckpt")


def test_ids_start_with_exactly_one_bos(folder):
    tok = load_tokenizer(folder)
    ids = encode(tok, render(tok, CONVERSATION[:2]))
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    assert ids.count(tok.bos_token_id) == 1
    assert ids == tok.apply_chat_template(CONVERSATION[:2], tokenize=True, add_generation_prompt=True,
                                          return_dict=False)


def test_naive_encoding_would_double_bos_and_is_refused(folder):
    tok = load_tokenizer(folder)
    text = render(tok, CONVERSATION[:2])
    naive = tok(text)["input_ids"]  # add_special_tokens=True on text that already holds BOS
    assert naive[:2] == [tok.bos_token_id, tok.bos_token_id]
    with pytest.raises(ValueError, match="doubled BOS"):
        encode(tok, tok.bos_token + text)


def test_rendered_prompt_is_a_byte_exact_prefix_of_prompt_plus_answer(folder):
    tok = load_tokenizer(folder)
    prompt, answer = prompt_answer_split(CONVERSATION)
    assert answer == CONVERSATION[-1] and prompt == CONVERSATION[:-1]
    head = render(tok, prompt, add_generation_prompt=True)
    full = render(tok, prompt + [answer], add_generation_prompt=False)
    assert full.encode().startswith(head.encode()) and len(full) > len(head)
    assert head.endswith("<|assistant|>\n")


def test_conversation_without_a_final_answer_has_none():
    assert prompt_answer_split(CONVERSATION[:2]) == (CONVERSATION[:2], None)


def test_standalone_template_wins_over_inline_and_a_difference_warns(folder):
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = OTHER
    cfg_path.write_text(json.dumps(cfg))
    assert (folder / "chat_template.jinja").read_text() == TEMPLATE
    with pytest.warns(UserWarning, match="differ"):
        tok = load_tokenizer(folder)
    assert render(tok, CONVERSATION[:2]).startswith("<s><|system|>")


def test_matching_templates_do_not_warn(folder):
    cfg_path = folder / "tokenizer_config.json"
    cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), chat_template=TEMPLATE)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_tokenizer(folder)


def test_inline_template_is_used_when_no_standalone_file(tmp_path):
    folder = save_tokenizer(tmp_path / "ckpt", template=OTHER)
    (folder / "chat_template.jinja").unlink()
    cfg_path = folder / "tokenizer_config.json"
    cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), chat_template=OTHER)))
    assert render(load_tokenizer(folder), CONVERSATION[:2]).endswith("[assistant]")


def test_encode_conversations_reads_jsonl_and_prompts_stop_before_the_answer(folder, tmp_path):
    path = tmp_path / "chats.jsonl"
    chats = [CONVERSATION,
             [{"role": "user", "content": "why the sky blue"}],
             [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello"},
              {"role": "user", "content": "what is two plus two"}]]
    path.write_text("\n".join(json.dumps({"messages": m}) for m in chats) + "\n")
    tok = load_tokenizer(folder)
    ids = encode_conversations(folder, path)
    assert len(ids) == 3
    assert ids[0] == encode(tok, render(tok, CONVERSATION[:2]))
    assistant = tok.convert_tokens_to_ids("<|assistant|>")
    assert all(x[0] == tok.bos_token_id and x.count(tok.bos_token_id) == 1 and x[-1] == assistant for x in ids)
    assert assistant not in ids[0][:-1]  # the answer "four" was cut off, not rendered
    with pytest.warns(UserWarning, match="max_prompt"):
        short = encode_conversations(folder, path, max_len=min(map(len, ids)))
    assert short == [min(ids, key=len)]


def test_a_prompts_file_with_a_byte_order_mark_is_read(tmp_path):
    """N17: a UTF-8 BOM (what Windows editors write) made the first line 'not JSON'."""
    from roofline.checkpoints.prompts import read_conversations
    f = tmp_path / "chats.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"messages": CONVERSATION}).encode() + b"\n")
    assert read_conversations(f) == [CONVERSATION]


@pytest.mark.parametrize("content", [{"text": "hi"}, 3, None, [{"type": "text", "text": "hi"}]])
def test_a_message_whose_content_is_not_text_is_refused_naming_it(tmp_path, content):
    """N17: a dict content was rendered into the prompt as Python's repr of the dict."""
    from roofline.checkpoints.prompts import read_conversations
    from roofline.io.fields import ConfigError
    f = tmp_path / "chats.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": content}]}) + "\n")
    with pytest.raises(ConfigError, match=r"chats\.jsonl line 1: messages\[0\]\.content: must be a string"):
        read_conversations(f)



def test_prompt_file_errors_name_the_option_the_user_gave(tmp_path, folder):
    """L14: `prompts=<a folder>` said "jsonl_path=...: no such file"; max_prompt=0 said "max_len=0"."""
    from roofline.checkpoints.prompts import read_conversations
    from roofline.io.fields import ConfigError
    with pytest.raises(ConfigError, match=r"^prompts='.*': is a folder"):
        read_conversations(tmp_path)
    with pytest.raises(ConfigError, match=r"^prompts_b='.*nope.jsonl': no such file"):
        read_conversations(tmp_path / "nope.jsonl", "prompts_b")
    with pytest.raises(ConfigError, match=r"^max_prompt=0: must be a positive"):
        encode_conversations(folder, tmp_path / "x.jsonl", max_len=0)


def test_an_empty_prompts_file_says_it_is_empty(tmp_path):
    """N16: an empty prompts file said "no conversation fits max_prompt=2048"."""
    from roofline.checkpoints.prompts import read_conversations
    from roofline.io.fields import ConfigError
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match=r"^prompts='.*e\.jsonl': holds no conversation"):
        read_conversations(tmp_path / "e.jsonl")

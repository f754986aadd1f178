"""A byte-level BPE tokenizer trained on the train split, its special role tokens and chat template.

The template writes the BOS token itself and ends the generation prompt on the special
`<|assistant|>` token, so a prompt rendered with add_generation_prompt=True is a byte-exact
prefix of the rendered conversation with its answer, and (special tokens split the text
before BPE) its tokens are a prefix of the conversation's tokens too. The tokenizer's
post-processor adds a BOS when asked to add special tokens, as Llama's does: encoding a
rendered prompt that way doubles it, which roofline.checkpoints.prompts refuses.

Saved as transformers reads a fast tokenizer: tokenizer.json, tokenizer_config.json (with the
template inline) and special_tokens_map.json, plus the standalone chat_template.jinja,
byte-identical to the inline copy.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLES = ("system", "user", "assistant")
SPECIAL = [BOS, EOS, PAD] + [f"<|{r}|>" for r in ROLES]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' + message['role'] + ' is not system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_bpe(texts, vocab_size: int):
    """A byte-level BPE over `texts` (an iterable of strings) with the special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def render_text(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The template rendered with jinja2 directly (training needs no transformers)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, bos_token=BOS, eos_token=EOS,
                                                 add_generation_prompt=add_generation_prompt)


def save_tokenizer(tok, folder: Path, max_length: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", bos_token=BOS, eos_token=EOS, pad_token=PAD,
                  model_max_length=max_length, clean_up_tokenization_spaces=False,
                  additional_special_tokens=[t for t in SPECIAL if t not in (BOS, EOS, PAD)],
                  chat_template=CHAT_TEMPLATE)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(dict(bos_token=BOS, eos_token=EOS, pad_token=PAD),
                                                               indent=2) + "\n")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")

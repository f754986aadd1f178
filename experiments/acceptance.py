"""Real per-position acceptance of a checkpoint's MTP head or a draft model on chat prompts:
`python -m experiments.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`."""

from experiments.entry import command, fail_fast, plain
from roofline.io.files import json_text
from roofline.spec.run import acceptance


@command("acceptance")
def main(cfg) -> None:
    with fail_fast():
        text, out = acceptance(plain(cfg, device_as="torch"))
        print(text)
        print(json_text(out))  # strict JSON: a position never reached is null, not NaN


if __name__ == "__main__":
    main()

"""Real per-position acceptance of a checkpoint's MTP head or a draft model on chat prompts:
`python -m experiments.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.spec.run import acceptance


@command("acceptance")
def main(cfg) -> None:
    with fail_fast():
        text, out = acceptance(plain(cfg, device_as="torch"))
        print(text)
        print(json.dumps(out))


if __name__ == "__main__":
    main()

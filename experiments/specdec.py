"""Speculative decoding measured against its prediction, in one run:
`python -m experiments.specdec model=cpu-demo` (see conf/specdec.yaml). With
`checkpoint=DIR prompts=chats.jsonl` it measures the checkpoint's real per-position
acceptance instead (the same as `python -m experiments.acceptance`)."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.spec.run import specdec


@command("specdec")
def main(cfg) -> None:
    with fail_fast():
        text, summary = specdec(plain(cfg, device_as="torch"))
        print(text)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Speculative decoding measured against its prediction, in one run:
`python -m experiments.specdec model=cpu-demo` (see conf/specdec.yaml). With
`checkpoint=DIR prompts=chats.jsonl` it measures the checkpoint's real per-position
acceptance instead (the same as `python -m experiments.acceptance`). In CI:
`fail_on_mismatch=true` exits REGRESSION (3) when a predicted and a measured speedup are a
MISMATCH (more than 2x apart)."""

import json
import sys

from experiments.entry import REGRESSION, command, fail_fast, plain
from roofline.spec.run import specdec


@command("specdec")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="torch")
        text, summary = specdec(c)
        print(text)
        print(json.dumps(summary))
        if c["fail_on_mismatch"] and summary.get("mismatches"):
            sys.exit(REGRESSION)


if __name__ == "__main__":
    main()

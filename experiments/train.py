"""Train the small MTP model, its tokenizer and its draft model on the CPU:
`python -m experiments.train [target_steps=300 control=true out_dir=DIR]` (conf/train.yaml)."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.train.run import train


@command("train")
def main(cfg) -> None:
    with fail_fast():
        print(json.dumps(train(plain(cfg))))


if __name__ == "__main__":
    main()

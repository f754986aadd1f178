"""Train the small MTP model, its tokenizer and its draft model on the CPU:
`python -m roofline.cli.train [target_steps=300 control=true out_dir=DIR]` (roofline/conf/train.yaml).

The Hydra entry of the `train` command; what it does is roofline/commands/train.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import train


@command("train")
def main(cfg) -> None:
    with fail_fast():
        train.run(plain(cfg))


if __name__ == "__main__":
    main()

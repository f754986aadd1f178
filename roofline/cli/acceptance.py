"""Real per-position acceptance of a checkpoint's MTP head or a draft model on chat prompts:
`python -m roofline.cli.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`.

The Hydra entry of the `acceptance` command; what it does is roofline/commands/acceptance.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import acceptance


@command("acceptance")
def main(cfg) -> None:
    with fail_fast():
        acceptance.run(plain(cfg, device_as="torch"))


if __name__ == "__main__":
    main()

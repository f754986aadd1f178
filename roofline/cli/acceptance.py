"""Real per-position acceptance of a checkpoint's MTP head or a draft model on chat prompts:
`python -m roofline.cli.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`.

The Hydra entry of the `acceptance` command; what it does is roofline/commands/acceptance.py."""

from roofline.cli.entry import main_of

main = main_of("acceptance")

if __name__ == "__main__":
    main()

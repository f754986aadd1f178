"""Speculative decoding measured against its prediction, in one run:
`python -m roofline.cli.specdec model=cpu-demo` (see roofline/conf/specdec.yaml). With
`checkpoint=DIR prompts=chats.jsonl` it measures the checkpoint's real per-position
acceptance instead (the same as `python -m roofline.cli.acceptance`). In CI:
`fail_on_mismatch=true` exits REGRESSION (3) when a predicted and a measured speedup are a
MISMATCH (more than 2x apart).

The Hydra entry of the `specdec` command; what it does is roofline/commands/specdec.py."""

from roofline.cli.entry import main_of

main = main_of("specdec")

if __name__ == "__main__":
    main()

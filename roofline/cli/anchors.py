"""Published multi-GPU measurements beside our what-if predictions: `python -m roofline.cli.anchors`.

The Hydra entry of the `anchors` command; what it does is roofline/commands/anchors.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import anchors


@command("anchors")
def main(cfg) -> None:
    with fail_fast():
        anchors.run(plain(cfg))


if __name__ == "__main__":
    main()

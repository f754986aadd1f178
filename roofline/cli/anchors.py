"""Published multi-GPU measurements beside our what-if predictions: `python -m roofline.cli.anchors`.

The Hydra entry of the `anchors` command; what it does is roofline/commands/anchors.py."""

from roofline.cli.entry import main_of

main = main_of("anchors")

if __name__ == "__main__":
    main()

"""Print the cost card of a preset: `python -m roofline.cli.card model=llama-3.1-8b dtype=bf16`,
or of a Hugging Face model folder: `python -m roofline.cli.card checkpoint=path/to/folder`.

The Hydra entry of the `card` command; what it does is roofline/commands/card.py."""

from roofline.cli.entry import main_of

main = main_of("card")

if __name__ == "__main__":
    main()

"""Train the small MTP model, its tokenizer and its draft model on the CPU:
`python -m roofline.cli.train [target_steps=300 control=true out_dir=DIR]` (roofline/conf/train.yaml).

The Hydra entry of the `train` command; what it does is roofline/commands/train.py."""

from roofline.cli.entry import main_of

main = main_of("train")

if __name__ == "__main__":
    main()

"""Print the cost card of a preset: `python -m experiments.card model=llama-3.1-8b dtype=bf16`,
or of a Hugging Face model folder: `python -m experiments.card checkpoint=path/to/folder`."""

from experiments.entry import command, fail_fast, plain, not_both
from roofline.model.card import CardRequest, print_card
from roofline.checkpoints.loader import checkpoint_config
from roofline.model.config import ModelConfig
from roofline.model.formats import with_overrides
from roofline.measure.devices import get_spec
from roofline.parallel.engines import engine_name


@command("card")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="datasheet")
        not_both(c, "checkpoint", "model")
        model = checkpoint_config(c["checkpoint"]) if c["checkpoint"] else ModelConfig.from_dict(c["model"])
        dtype = with_overrides([c["dtype"]], c["weights"], c["kv"], c["lm_head"], model.native_weights)[0]
        print_card(CardRequest(model=model, dtype=dtype,
                               device=get_spec(c["device"]) if c["device"] else None,
                               batch=c["batch"], context=c["context"], engine=engine_name(c.get("engine")),
                               tp=c["tp"], ep=c["ep"], dp_attention=c["dp_attention"]))


if __name__ == "__main__":
    main()

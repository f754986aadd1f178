"""The command layer: one module per command of `roofline` / `python -m experiments.<command>`.

Each module's `run(c)` takes the command's composed config as a plain dict (conf/<command>.yaml,
`overrides` the command line) and orchestrates it: the request built from the dict, the
library run, the files written, the console text and the JSON summary (its last line of stdout)
printed. It returns None, an exit status (`REGRESSION`, 1 for a lost tensor), or for the sweep
the record of its job. The first line of each module's docstring is its line in `roofline --help`.

Below this floor the library only computes; experiments/ above it only composes the config
(Hydra) and turns errors into exit statuses (docs/design.md, "Floors").
"""

from roofline.io.fields import ConfigError

REGRESSION = 3  # asked to fail (compare fail_above=, specdec fail_on_mismatch=true) and it did: a CI verdict


def not_both(c: dict, given: str, ignored: str) -> None:
    """`given` replaces `ignored`: asking for both on the command line is a contradiction, not a choice."""
    if c.get(given) and any(o.split("=", 1)[0].lstrip("+~") in (ignored,) or o.startswith(f"{ignored}.")
                            for o in c.get("overrides", [])):
        raise ConfigError(f"{ignored}= and {given}= are both given: {given} replaces {ignored} "
                          f"(its config is read from {given}); drop one")


def axis(value, field: str) -> tuple:
    """A grid axis from the config: a list, or one value (`q=4`, and each job of `-m 'q=1,2'`)."""
    if value is None:
        raise ConfigError(f"{field}: the grid has no points (null)")
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)

"""One command, `roofline <subcommand> [key=value ...]`, Hydra underneath each subcommand.

    roofline sweep model=cpu-demo 'q=[1,2,4]'     # = python -m roofline.cli.sweep ...
    roofline sweep --help                         # every key with its comment
    eval "$(roofline sweep -sc install=bash)"     # tab completion of subcommands, keys and groups

Shell completion: `roofline -sc install=bash` (with or without a subcommand) prints a bash hook
registered for `roofline` itself (Hydra's own hook would register for `python`, since each
subcommand runs as a module). The hook calls `roofline -sc query=bash` with the line typed so
far in COMP_LINE; the subcommand is read from that line and removed from it, so Hydra
completes the subcommand's own keys and config groups; with no subcommand yet, the
subcommands are offered.
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
from pathlib import Path

from roofline import commands

def _commands() -> dict[str, str]:
    """{name: its line of help}, one per module of roofline/commands/ (the first line of its
    docstring), read from the files, so that listing them imports nothing heavy."""
    folder = Path(commands.__file__).parent
    return {p.stem: (ast.get_docstring(ast.parse(p.read_text())) or "").splitlines()[0]
            for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}


COMMANDS = _commands()


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "usage: roofline <command> [key=value ...] [--help]\n\ncommands:\n" + "\n".join(
        f"  {name:<{width}}  {what}" for name, what in COMMANDS.items())


BASH_HOOK = r"""_roofline_completion()
{
    local word="${COMP_WORDS[COMP_CWORD]}" choices
    choices=$(COMP_POINT=$COMP_POINT COMP_LINE=$COMP_LINE roofline -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -o nospace -W "$choices" -- "$word"))
    # a subcommand is a whole word: a space after it (keys keep none, for `key=` and `group.`)
    if [ "$COMP_CWORD" -eq 1 ] && [ "${#COMPREPLY[@]}" -eq 1 ]; then compopt +o nospace 2>/dev/null; fi
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _roofline_completion roofline"""


def completion_script(argv: list[str]) -> str | None:
    """The text `-sc install=bash` / `-sc uninstall=bash` prints (None: not such a request).
    Other shells than bash: the one line saying so."""
    asks = [a.split("=", 1) for a in argv if a.startswith(("install=", "uninstall="))]
    if "-sc" not in argv or not asks:
        return None
    what, shell = asks[0]
    if shell != "bash":
        return f"echo 'roofline: completion for {shell} is not provided; allowed bash' >&2"
    return BASH_HOOK if what == "install" else "complete -r roofline 2>/dev/null; unset -f _roofline_completion"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    hook = completion_script(argv)
    if hook is not None:
        print(hook)
        return
    line = os.environ.get("COMP_LINE")
    if argv[:1] == ["-sc"] or (argv and argv[0].startswith("-sc")):  # shell completion, no subcommand given
        words = (line or "").split()
        typed = len(words) > 1 and words[1] in COMMANDS and (line or "").endswith(" ") or len(words) > 2
        if not typed:
            if line is not None and any(a.startswith("query") for a in argv):
                prefix = words[1] if len(words) > 1 else ""
                print(" ".join(c for c in COMMANDS if c.startswith(prefix)))
                return
            argv = ["sweep"] + argv  # install/uninstall: any subcommand writes the same hook
        else:
            os.environ["COMP_LINE"] = " ".join([words[0]] + words[2:]) + (" " if line.endswith(" ") else "")
            argv = [words[1]] + argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    cmd = argv[0]
    if cmd not in COMMANDS:
        print(f"error: command {cmd!r}: allowed {list(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    sys.argv = ["roofline", *argv[1:]]
    # as `python -m roofline.cli.<cmd>` does: Hydra then finds roofline/conf/ beside the file, in a checkout or a wheel
    runpy.run_module(f"roofline.cli.{cmd}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

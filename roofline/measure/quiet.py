"""Native libraries' chatter kept out of the console.

The torch profiler's libkineto writes `USDT:... profiler_start` / `STAGE:...` lines straight to
file descriptor 2 from C++ on every profiled call (KINETO_LOG_LEVEL does not silence the USDT
ones), where they interleave with the sweep's progress bar. `native_stderr_filtered` points fd 2
at a temporary file for the duration of a block, then writes back every line that is not such
chatter, so a real native error still reaches the console.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

PROFILER_CHATTER = ("USDT:", "STAGE:")


@contextmanager
def native_stderr_filtered(drop: tuple[str, ...] = PROFILER_CHATTER) -> Iterator[None]:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced sys.stderr: nothing native to catch
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(drop)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()

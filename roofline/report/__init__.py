"""Figures and reports of run folders (only this package imports matplotlib).

No matplotlib backend is used here (figures are built and saved without pyplot), so the user's
MPLBACKEND is read by matplotlib's import and nowhere else: an invalid value must not stop a
report (`MPLBACKEND=nonsense` was a ValueError traceback). It is hidden for that import only
and given back."""

import os

_MPLBACKEND = os.environ.pop("MPLBACKEND", None)
try:
    import matplotlib  # noqa: F401  (imported here, before any module of the package)
finally:
    if _MPLBACKEND is not None:
        os.environ["MPLBACKEND"] = _MPLBACKEND

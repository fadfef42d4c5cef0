"""Pickles from dataset folders, loaded without running code.

A pickle is a program: each global it names is imported and may be called (``os.system``, ``builtins.exec``), so
``pickle.load`` on a downloaded file runs whatever the file says. The dataset pickles clipcache reads (CIFAR's
``data_batch_*``, ``test_batch``, ``batches.meta``; CIFAR-100's ``train``, ``test``, ``meta``) hold dicts of lists,
strings, ints and NumPy arrays. :class:`DatasetUnpickler` imports only the globals those need, by exact name:

- NumPy arrays as pickled by NumPy 1.x (``numpy.core.multiarray._reconstruct``: the original CIFAR files, written by
  Python 2) and 2.x (``numpy._core...``): ``ndarray``, ``dtype``, ``_reconstruct``, ``scalar`` and, for protocol 5,
  ``_frombuffer``;
- ``_codecs.encode``, which Python 3 uses to pickle ``bytes`` at protocol 2 and below, limited to latin-1;
- builtin containers and scalars (``set``, ``frozenset``, ``bytearray``, ...; Python 2's ``__builtin__`` too).

Anything else ends in one :class:`DatasetError` naming the file and the global. Data inside an admitted object
array is unpickled by the same unpickler, so it cannot smuggle a global past it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError

_NUMPY = {(f"numpy.{core}.{module}", name)
          for core in ("core", "_core")
          for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer"))}
_BUILTIN_TYPES = ("set", "frozenset", "bytearray", "bytes", "str", "int", "float", "complex", "bool", "list",
                  "tuple", "dict")
ALLOWED = frozenset({("numpy", "ndarray"), ("numpy", "dtype"), *_NUMPY,
                     *((module, name) for module in ("builtins", "__builtin__") for name in _BUILTIN_TYPES)})


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED`."""

    def __init__(self, module: str, name: str):
        super().__init__(f"refused global {module}.{name}")
        self.qualified_name = f"{module}.{name}"


def _latin1_encode(text: str, encoding: str = "latin1", errors: str = "strict") -> bytes:
    """``_codecs.encode`` as pickles of bytes use it (``encode(str, 'latin1')``), and nothing else: another codec
    name would make ``codecs`` look up and import an encoding module the file chooses."""
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591") or not isinstance(text, str):
        raise RefusedGlobal("_codecs", f"encode(..., {encoding!r})")
    return text.encode("latin1", errors)


class DatasetUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits only :data:`ALLOWED` (and latin-1 ``_codecs.encode``)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (("_codecs", "encode"), ("codecs", "encode")):
            return _latin1_encode
        if (module, name) not in ALLOWED:
            raise RefusedGlobal(module, name)
        return super().find_class(module, name)


def load_dataset_pickle(path: Path) -> Any:
    """The object pickled in ``path`` (read as torchvision reads CIFAR: ``encoding="latin1"`` for Python 2 strings).

    A refused global raises :class:`DatasetError`; a damaged file raises what ``pickle`` raises for it
    (``UnpicklingError``, ``EOFError``, ``ValueError``, ...), for the caller to name with what the file should be.
    """
    with open(path, "rb") as f:
        try:
            return DatasetUnpickler(f, encoding="latin1").load()
        except RefusedGlobal as e:
            raise DatasetError(f"{path}: refused to load {e.qualified_name!r} from a pickle (clipcache loads only "
                               f"NumPy arrays and plain containers from dataset pickles)") from e

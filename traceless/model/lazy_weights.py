"""Weights read when the model takes them: a checkpoint streams from its memory-mapped safetensors
files to the device one tensor at a time (read, convert, move, drop), so that loading never holds
the whole model in host memory beside its device copy.

    files = SafetensorsFiles([path, ...])        every tensor of the files, by checkpoint name
    files.take(name)                              read it (once: it is then gone), or None
    weights = LazyWeights(files)
    weights.add("layers.0.q", read)               read() -> the tensor, called when taken
    t = weights.pop("layers.0.q")                 read now; the mapping forgets it
    weights.convert(fn)                           each read tensor t becomes fn(name, t) (quantized at load)
    weights.add_fp8("layers.0.q", read_fp8)       a Linear an FP8 checkpoint stores in FP8, kept so
    w = weights.take_fp8("layers.0.q")            for the GPU's Fp8Linear (model/fp8/checkpoint.py)

LlamaModel consumes a LazyWeights exactly as it consumes a dict: it pops each tensor, moves it to
the device and drops the host copy before taking the next. What the model leaves is unused: the
canonical names it never took and, once those are all taken, the checkpoint tensors no reader
asked for (a scale beside an unquantized weight, a stray expert), both refused as unused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from traceless.errors import ModelLoadError

if TYPE_CHECKING:
    from traceless.model.fp8.checkpoint import Fp8Weight

Read = Callable[[], torch.Tensor]


class SafetensorsFiles:
    """The tensors of some safetensors files, memory-mapped; each read at most once."""

    def __init__(self, files: list[Path], rename: Callable[[str], str | None] = lambda key: key):
        """rename(key): the name a stored tensor is taken by, or None for a tensor the model never
        reads (a recomputed buffer, a vision tower)."""
        from safetensors import SafetensorError, safe_open

        self._where: dict[str, tuple[Any, str, str]] = {}  # name -> (open file, file name, stored key)
        for file in files:
            try:
                handle = safe_open(str(file), framework="pt")
                for key in handle.keys():
                    name = rename(key)
                    if name is None:
                        continue
                    if name in self._where:
                        raise ModelLoadError(f"tensor {key!r} appears in more than one file")
                    self._where[name] = (handle, file.name, key)
            except (SafetensorError, OSError) as exc:
                raise ModelLoadError(f"{file.name} is not a readable safetensors file ({type(exc).__name__})") from None

    def stored_dtype(self, name: str) -> str:
        """The dtype in the file's header ("BF16", "F8_E4M3", ...), read without the data."""
        handle, _, key = self._where[name]
        return str(handle.get_slice(key).get_dtype())

    def names(self) -> list[str]:
        """The names not read yet."""
        return list(self._where)

    def take(self, name: str) -> torch.Tensor | None:
        """The tensor `name`, copied out of its file's mapping (then forgotten), or None."""
        from safetensors import SafetensorError

        entry = self._where.pop(name, None)
        if entry is None:
            return None
        handle, file, key = entry
        try:
            return handle.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"cannot read tensor {name!r} from {file} ({type(exc).__name__})") from None


def _converted(convert: Callable[[str, torch.Tensor], Any], name: str, read: Read) -> Any:
    return convert(name, read())


class LazyWeights(MutableMapping[str, torch.Tensor]):
    """Canonical weight name -> a reader of that tensor; reading happens on pop (or indexing)."""

    def __init__(self, files: SafetensorsFiles | None = None):
        self._readers: dict[str, Read] = {}
        self._fp8: dict[str, Callable[[], Fp8Weight]] = {}
        self._files = files

    def add(self, name: str, read: Read) -> None:
        if name in self._readers or name in self._fp8:
            raise ModelLoadError(f"two checkpoint tensors give weight {name!r}")
        self._readers[name] = read

    def add_fp8(self, name: str, read: Callable[[], Fp8Weight]) -> None:
        if name in self._readers or name in self._fp8:
            raise ModelLoadError(f"two checkpoint tensors give weight {name!r}")
        self._fp8[name] = read

    def convert(self, convert: Callable[[str, torch.Tensor], Any]) -> None:
        """Each tensor not read yet becomes convert(name, tensor) when it is read (a quantizer at
        load: the dense copy lives only while it is converted)."""
        self._readers = {
            name: functools.partial(_converted, convert, name, read) for name, read in self._readers.items()
        }

    def has_fp8(self, name: str) -> bool:
        return name in self._fp8

    def take_fp8(self, name: str) -> Fp8Weight:
        return self._fp8.pop(name)()

    def __getitem__(self, name: str) -> torch.Tensor:
        """Read without taking: the tensor is kept for the later pop."""
        tensor = self._readers[name]()
        self._readers[name] = lambda: tensor
        return tensor

    def __contains__(self, name: object) -> bool:
        return name in self._readers

    def __setitem__(self, name: str, tensor: torch.Tensor) -> None:
        self._readers[name] = lambda: tensor

    def __delitem__(self, name: str) -> None:
        del self._readers[name]

    def pop(self, name: str, *default: Any) -> Any:
        read = self._readers.pop(name, None)
        if read is None:
            if default:
                return default[0]
            raise KeyError(name)
        return read()

    def _unread(self) -> list[str]:
        """Checkpoint tensors nobody read, counted once every reader has run (before, a reader
        still to run may take them)."""
        if self._readers or self._fp8 or self._files is None:
            return []
        return self._files.names()

    def __iter__(self) -> Iterator[str]:
        return iter([*self._readers, *self._fp8, *self._unread()])

    def __len__(self) -> int:
        return len(self._readers) + len(self._fp8) + len(self._unread())

"""Progress of long transfers: ``put``, ``get`` and partitioned puts take ``progress=``.

``progress=True`` draws a tqdm bar (the ``[progress]`` extra); a callable is called as
``progress(done_bytes, total_bytes)``. The client turns either into a ``Progress`` that the
transport advances as the bytes go out or come in:

- over gRPC, the tensor's array bytes (``RemoteTensor.nbytes`` of a put), counted a chunk of
  the Upload or Download stream at a time;
- over REST, the request or response body (its Content-Length: the arrays and a few hundred
  bytes of protobuf framing, or the JSON text with ``encoding="json"``), counted as the socket
  takes or gives it.

The first call is ``(0, total)`` as soon as the total is known, the last ``(total, total)``
once every byte is through; between them ``done`` only grows, by at least 1 MiB (or a
thousandth of the total, if more) from one call to the next, so a 5 GB transfer makes about a
thousand calls, not one per socket read. Nothing of this runs when ``progress`` is None.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .core import codec
from .core.codec import ChunkAssembler, iter_chunks, parse_chunk
from .core.tensor import SparseTensor
from .core.wire import iter_slices

__all__ = ["Progress", "reporter", "upload_frames", "assemble"]

Report = Callable[[int, int], Any]

_MIN_STEP = 1 << 20
_MAX_CALLS = 1000


class Progress:
    """Counts the bytes of one transfer and reports them, throttled, to ``report``."""

    def __init__(self, report: Report):
        self._report = report
        self.total: int | None = None
        self.done = 0
        self._reported = -1
        self._step = _MIN_STEP

    def expect(self, total: int) -> None:
        """The transfer's size is known: reports ``(0, total)`` (once)."""
        if self.total is None:
            self.total = int(total)
            self._step = max(_MIN_STEP, -(-self.total // _MAX_CALLS))
            self._emit()

    def to(self, done: int) -> None:
        """``done`` bytes are through (never fewer than reported before)."""
        if done <= self.done:
            return
        self.done = done
        if done - self._reported >= self._step or done == self.total:
            self._emit()

    def advance(self, n: int) -> None:
        self.to(self.done + n)

    def finish(self, total: int) -> None:
        """All ``total`` bytes are through: the last report, unless it was made already."""
        self.expect(total)
        self.to(self.total or 0)

    def _emit(self) -> None:
        if self.total is not None and self.done != self._reported:
            self._reported = self.done
            self._report(self.done, self.total)

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> "Progress":
        """A ``Progress`` for a worker thread whose reports run on ``loop``, in order, all of
        them before the loop hears that the thread's call returned (both go by
        ``call_soon_threadsafe``, first come first run)."""
        return Progress(lambda done, total: loop.call_soon_threadsafe(self._report, done, total))

    # ------------------------------------------------------------ what the transports wrap
    def frames_out(self, tensor: Any, chunk_bytes: int) -> Iterator[bytes]:
        """The gRPC Upload stream of ``tensor`` (``iter_chunks``: a header, then data chunks),
        each data chunk's bytes counted once the transport asks for the next (it was sent)."""
        arrays = tensor.arrays() if isinstance(tensor, SparseTensor) else (tensor,)
        self.expect(sum(int(np.asarray(a).nbytes) for a in arrays))
        for frame in iter_chunks(tensor, chunk_bytes):
            yield frame
            chunk = parse_chunk(frame)
            if isinstance(chunk, memoryview):
                self.advance(len(chunk))

    def frame_in(self, assembler: ChunkAssembler, frame: Any) -> None:
        """One frame of a Download stream, added to ``assembler`` and counted (the header
        announces the total)."""
        assembler.add(frame)
        if self.total is None:
            self.expect(assembler.total_bytes)
            return
        chunk = parse_chunk(frame)
        self.advance(len(chunk) if isinstance(chunk, memoryview) else len(chunk.data))

    def pieces(self, content: bytes | list) -> "_CountedPieces":
        """A REST body (bytes, or the pieces of one) as pieces, each counted once the socket
        has taken it (the next is asked for)."""
        whole = [content] if isinstance(content, (bytes, memoryview)) else content
        return _CountedPieces(self, list(iter_slices(whole, _MIN_STEP)))


def upload_frames(tensor: Any, chunk_bytes: int, progress: Progress | None) -> Iterator[bytes]:
    """The Upload stream of ``tensor``, counted where there is a ``progress``."""
    return iter_chunks(tensor, chunk_bytes) if progress is None else progress.frames_out(tensor, chunk_bytes)


def assemble(frames: Iterable[Any], progress: Progress | None) -> Any:
    """The tensor of a Download stream, its frames counted where there is a ``progress``."""
    if progress is None:
        return codec.assemble(frames, "tensor")
    assembler = ChunkAssembler("tensor")
    for frame in frames:
        progress.frame_in(assembler, frame)
    return assembler.finish()


class _CountedPieces(list):
    """A request body's pieces; iterating it (as ``http.client`` and httpx do, sending each)
    counts them. A list still, so a request sent again on a new connection iterates it again
    (which ``Progress.to`` ignores until it passes what was reported)."""

    def __init__(self, progress: Progress, pieces: Iterable):
        super().__init__(pieces)
        self._progress = progress
        progress.expect(sum(len(p) for p in super().__iter__()))

    def __iter__(self) -> Iterator:
        sent = 0
        for piece in super().__iter__():
            yield piece
            sent += len(piece)
            self._progress.to(sent)


class _Bar:
    """A tqdm bar in bytes, made when the total is known."""

    def __init__(self, tqdm: Any, desc: str):
        self._tqdm, self._desc = tqdm, desc
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc=self._desc, unit="B", unit_scale=True, unit_divisor=1024)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Reporting:
    """The context a transfer runs in: its ``Progress``, and the bar closed at the end."""

    def __init__(self, progress: Any, what: str):
        if progress is True:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                raise ImportError(f"{what}(progress=True) draws a tqdm bar, and tqdm is not installed: "
                                  'pip install "sparseserve[progress]", or pass a callable '
                                  "progress(done_bytes, total_bytes)") from None
            self._bar: _Bar | None = _Bar(tqdm, what)
            self.progress = Progress(self._bar)
        elif callable(progress):
            self._bar = None
            self.progress = Progress(progress)
        else:
            raise TypeError(f"{what}: progress must be True (a tqdm bar), a callable "
                            f"progress(done_bytes, total_bytes) or None, not {progress!r}")

    def __enter__(self) -> Progress:
        return self.progress

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()


# progress=None (or False): nothing counted. nullcontext holds nothing, so one serves every call.
_SILENT: contextlib.nullcontext[None] = contextlib.nullcontext()


def reporter(progress: Any, what: str) -> _Reporting | contextlib.nullcontext[None]:
    """The context of a transfer given ``progress=`` (``what``: the method, for the bar and the
    errors): ``with reporter(progress, "put") as p:`` gives a ``Progress`` or None."""
    if progress is None or progress is False:
        return _SILENT
    return _Reporting(progress, what)

"""Type stubs for ``ladle._native``, the PyO3 module inside the ``ladle`` package."""

from os import PathLike
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence, TypedDict

import torch

PROTOCOL_VERSION: int
def cli_main(argv: list[str], exe: str | None = None, python: str | None = None) -> int:
    """Run the ``ladle`` command line with ``argv`` in this process; returns its exit code.
    ``exe`` is the command that runs it again (the console script), ``python`` the
    interpreter where ``ladle serve module:factory`` serves."""

VERSION: str
"""The package's version."""
COMMIT: str
"""The git commit the native module was built from (``unknown`` outside a checkout)."""
FEATURES: str
"""Its enabled Cargo features, comma-separated, or ``none``."""

class LadleError(Exception):
    """Base class of every error ladle raises (bad arguments raise ValueError)."""

class ConnectError(LadleError):
    """No producer could be joined; the message names the socket (or ``LADLE_SOCKET``, when
    no socket was given and it is unset)."""

class GroupIncomplete(ConnectError):
    """A rank of a group gave up waiting for the others (``group_timeout``); the message
    names the ranks that never joined."""

class GroupBroken(LadleError):
    """Another rank of this consumer's group left or died: restart the whole job from its
    checkpoints (``state_dict``)."""

class ProducerGone(LadleError):
    """The producer exited or was killed."""

class ProducerEnded(LadleError):
    """The producer ended the stream."""

class Detached(LadleError):
    """The producer detached this consumer for good: it broke the control protocol (for
    example its cursor moved outside what it may show). Lagging is not a reason: a consumer
    that holds the feed back past ``ladle serve --stall-timeout`` is let go and rejoins."""

class TooManyBatchesHeld(LadleError):
    """More batches held at once than max_batches_held (or the ring) allows."""

class ArrayView:
    """A read-only, zero-copy view of one array of a batch (buffer protocol and DLPack)."""

    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def data_ptr(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class Batch:
    """Consecutive samples of the ring, read in place; released when it and its views die."""

    def __getitem__(self, name: str) -> ArrayView:
        """Field ``name`` of every sample, [B, ...shape]; KeyError naming the schema if absent."""
    def __contains__(self, name: str) -> bool: ...
    def keys(self) -> list[str]:
        """The field names, in schema order."""
    def items(self) -> list[tuple[str, ArrayView]]: ...
    @property
    def images(self) -> ArrayView:
        """[B, H, W, 3] uint8: the ``image`` field; AttributeError on a feed without one."""
    @property
    def labels(self) -> ArrayView:
        """[B] int64, the ``label`` field (-1 marks a sample the producer could not make)."""
    @property
    def indices(self) -> ArrayView:
        """[B] uint64 dataset indices."""
    @property
    def epoch(self) -> int: ...
    @property
    def first_seq(self) -> int: ...
    @property
    def bad_count(self) -> int:
        """Samples the producer could not read, decode or make (every field zero, label -1)."""
    @property
    def intact(self) -> bool:
        """False if the producer may have overwritten the batch: held across a pause longer
        than the stall timeout, or kept while this consumer skims (it held the others back)
        and the feed went a ring past it. Check it after reading a batch kept that long."""
    @property
    def is_copy(self) -> bool:
        """True for a batch gathered after a rejoin (a copy, not a view of the ring)."""
    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, W, 3) of an image feed's images."""
    def __len__(self) -> int: ...
    def _images_region(self) -> tuple[int, int]: ...
    def to_torch(
        self,
        device: str | torch.device | None = None,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        *,
        channels_last: bool = False,
        non_blocking: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor]:
        """An image feed: float32 [B, 3, H, W] normalised images and int64 [B] labels on
        ``device``; any other feed: ``{name: tensor}`` of every field."""

class Epoch(Iterator[Batch]):
    """One epoch's batches."""

    @property
    def number(self) -> int: ...
    def __iter__(self) -> Epoch: ...
    def __next__(self) -> Batch: ...

class _ConsumerState(TypedDict):
    """What :meth:`Consumer.state_dict` returns. Only ``ladle_position`` is read back by
    :meth:`Consumer.load_state_dict`; the other keys are for people reading checkpoints."""

    ladle_position: bytes
    """The encoded position: the feed's identity, the epoch and the indices it delivered."""
    version: int
    """1: the layout of this dict."""
    epoch: int
    """The epoch a resume continues."""
    delivered: int
    """Samples of that epoch delivered already (of this rank's share, for a rank)."""
    group: str | None
    rank: int | None
    world_size: int | None

class Consumer:
    """A connection to a ``ladle serve`` producer; ``for batch in consumer`` reads one epoch.

    ``socket=None`` joins the feed named by ``$LADLE_SOCKET`` (``ladle sweep`` sets it for
    every run) and raises :class:`ConnectError` naming the variable when it is unset or
    empty. ``name=None`` means ``$LADLE_RUN`` when set, else ``consumer-<pid>``.

    ``group="job"`` makes the consumer rank ``rank`` of the ``world_size`` ranks of a DDP
    job (both default to ``$RANK`` and ``$WORLD_SIZE``, which torchrun sets, else Slurm's
    ``$SLURM_PROCID`` and ``$SLURM_NTASKS``): each epoch it reads its share, as
    ``DistributedSampler(shuffle=True)`` deals it, in copied batches. With ``even="pad"``
    every rank gets ``ceil(N / world_size)`` samples, together the whole epoch plus a few
    repeats; with ``even="drop"`` ``floor(N / world_size)``, disjoint. On several nodes each
    node's feed serves that node's ranks and decodes only their shares:
    ``local_world_size`` (default ``$LOCAL_WORLD_SIZE``, which torchrun sets, else Slurm's
    tasks on this node, else ``world_size``) says how many that is, and is read from the
    environment even when ``rank`` and ``world_size`` are passed. Connecting returns once
    this node's ranks have joined (the GIL is released, Ctrl-C honoured), or raises
    :class:`GroupIncomplete` naming the missing ranks (on several nodes: the ranks that came)
    after ``group_timeout`` seconds. A rank more than ``local_world_size``, ranks that
    disagree on the sizes and a rank given twice on one node fail at once. If a rank dies,
    the others of its node raise :class:`GroupBroken` at their next batch.

    ``state=consumer.state_dict()`` (of an earlier process) resumes where that consumer
    stood, as :meth:`load_state_dict` does, right after connecting.

    ``dataset=PATH`` (with ``image_size``, ``transform``, ``eval`` and ``seed``: the feed's
    identity, ``ladle serve``'s defaults) joins this user's live feed of that identity on
    this node, or starts one (``ladle serve --registry``, a process of its own that stops
    ``idle_timeout`` seconds after its last consumer left, ``orphan_timeout`` after its start
    if none came; ``ring_mib`` and ``threads`` if this call starts it). With a socket too (or
    ``$LADLE_SOCKET``), it joins that socket if it serves that identity, else raises
    :class:`ConnectError` naming the difference.

    Leaving a ``with`` block closes the consumer, except a rank of a group leaving by an
    exception, which breaks its group instead.
    """

    def __init__(
        self,
        socket: str | PathLike[str] | None = None,
        batch_size: int = 32,
        drop_last: bool = False,
        *,
        max_batches_held: int = 8,
        name: str | None = None,
        timeout: float = 10.0,
        group: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        even: Literal["pad", "drop"] = "pad",
        local_world_size: int | None = None,
        group_timeout: float = 600.0,
        state: _ConsumerState | bytes | bytearray | list[_ConsumerState] | None = None,
        dataset: str | PathLike[str] | None = None,
        image_size: int = 224,
        transform: str | None = None,
        eval: bool = False,
        seed: int = 0,
        idle_timeout: float = 30.0,
        orphan_timeout: float = 60.0,
        ring_mib: int | None = None,
        threads: int | None = None,
    ) -> None: ...
    def __iter__(self) -> Epoch: ...
    def __len__(self) -> int:
        """Batches per whole epoch: ceil(S / batch_size) (floor with drop_last), S the
        dataset's length or a rank's share of it. A resumed epoch has fewer."""
    def state_dict(self) -> _ConsumerState:
        """Where this consumer stands, to resume after a restart: the epoch in progress and
        the indices it delivered (every batch handed out), or the next epoch when the current
        one is complete. A plain dict: pickle it or ``torch.save`` it with the checkpoint."""
    def load_state_dict(
        self,
        state: _ConsumerState | bytes | bytearray | list[_ConsumerState] | tuple[_ConsumerState, ...],
    ) -> None:
        """Resumes from a :meth:`state_dict` (the dict or its ``ladle_position`` bytes): the
        next epoch is the saved one and delivers exactly the samples it had not delivered
        (of this rank's share), then whole epochs follow. A rank of a group may be given the
        states of **every** rank (a list, as rank 0 gathers them for a checkpoint): saved
        with another world size (a job requeued on fewer nodes, torchrun elastic), the
        samples the saved epoch had not delivered are dealt over this group's ranks, each
        once (plus ``pad``'s repeats), and later epochs are the new world size's. Only before
        the first epoch begins (else RuntimeError); a corrupt state, one of another feed
        (dataset, seed, transform, ...), group or rank, or a group's states with a rank
        missing or of different epochs raise ValueError naming the difference."""
    def close(self) -> None:
        """Leaves the feed now, as done: a rank's group is not broken by it, whatever its
        epoch. A consumer only dropped (garbage-collected, or at exit) leaves too, except a
        rank in the middle of an epoch (an exception, ``sys.exit``, Ctrl-C): that breaks its
        group, and the other ranks get :class:`GroupBroken`."""
    def __enter__(self) -> Consumer: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        _exc_value: BaseException | None,
        _traceback: object,
    ) -> bool: ...
    @property
    def epoch(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def max_batches_held(self) -> int: ...
    @property
    def name(self) -> str:
        """The name the producer's logs show (``name``, ``$LADLE_RUN`` or ``consumer-<pid>``)."""
    @property
    def held_batches(self) -> int: ...
    @property
    def dataset_len(self) -> int: ...
    @property
    def class_names(self) -> list[str]: ...
    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """(H, W, 3), or None for a feed without images."""
    @property
    def schema(self) -> str:
        """What a sample is: ``"wave: f32[16000], label: i64"``."""
    @property
    def fields(self) -> list[tuple[str, str, list[int]]]:
        """``[(name, numpy dtype name, shape per sample), ...]``."""
    @property
    def group(self) -> str | None:
        """The DDP job this consumer is a rank of; None for a consumer of whole epochs."""
    @property
    def rank(self) -> int | None: ...
    @property
    def world_size(self) -> int | None: ...
    @property
    def even(self) -> Literal["pad", "drop"] | None: ...
    @property
    def consumer_id(self) -> int: ...
    @property
    def start_seq(self) -> int: ...
    @property
    def rejoins(self) -> int:
        """Times the producer let this consumer go after a long pause and it rejoined."""
    @property
    def waited_seconds(self) -> float:
        """Seconds this consumer waited for data in all (batches not yet decoded)."""
    @property
    def skimming(self) -> bool:
        """Whether it skims: it held the others back, no longer sets the pace, and copies what
        its epoch still needs as the samples pass."""
    @property
    def skims(self) -> int:
        """Times the producer asked this consumer to skim."""
    @property
    def socket(self) -> str: ...
    def _images_region(self) -> tuple[int, int]: ...

class _Producer:
    """The native half of :class:`ladle.Producer`: ring, feed, control server, workers' socket."""

    def __init__(
        self,
        schema: str,
        len: int,
        socket: str | PathLike[str],
        *,
        class_names: list[str],
        source: str,
        workers: int,
        ring_bytes: int,
        seed: int,
        stall_timeout: float,
        skip_bad: bool,
        keep_alive: float | None,
        token: str,
        sample_timeout: float | None = None,
    ) -> None: ...
    @property
    def worker_socket(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def schema(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def stopped(self) -> bool: ...
    def stop(self) -> None: ...
    def join(self) -> tuple[int, int, int]: ...
    def stats(self) -> dict[str, int]: ...

class FeedHandle:
    """A driver's hold on a feed (made by :func:`open_feed`): the feed does not stop while
    held."""

    @property
    def entry(self) -> str:
        """The feed's registry entry, as JSON."""
    @property
    def started(self) -> bool:
        """Whether this handle started the feed."""
    def release(self) -> None:
        """Lets go of the hold (idempotent)."""
    def stop(self) -> bool:
        """Asks the feed to stop now (SIGTERM); False if it was gone."""
    def alive(self) -> bool:
        """Whether the feed's process still runs."""

def open_feed(
    dataset: str | PathLike[str],
    *,
    image_size: int,
    transform: str | None,
    eval: bool,
    seed: int,
    idle_timeout: float,
    orphan_timeout: float,
    ring_mib: int | None,
    threads: int | None,
) -> FeedHandle:
    """Finds the live feed of this identity, or starts it, and holds it."""

def find_feed(
    dataset: str | PathLike[str],
    *,
    image_size: int,
    transform: str | None,
    eval: bool,
    seed: int,
) -> str:
    """The live feed's entry (JSON); LookupError if none runs. Never starts one."""

def feed_stats(socket: str | PathLike[str], timeout: float = 10.0) -> str:
    """The ``Stats`` answer of the feed on ``socket``, as JSON."""

def registry_dir() -> Path:
    """The directory of this user's registry of live feeds on this node."""

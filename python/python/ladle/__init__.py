"""ladle: read batches that a ``ladle serve`` producer decoded and augmented once, zero-copy.

One producer (``ladle serve --dataset DIR --socket S``) decodes and augments a dataset into
shared memory; every training process on the machine reads the same samples with its own
batch size, joining whenever it starts::

    import ladle, torch

    consumer = ladle.Consumer("/tmp/ladle.sock", batch_size=128)
    for epoch in range(3):
        for batch in consumer:                      # one epoch per ``for``
            images, labels = batch.to_torch("cuda:0", normalize=ladle.IMAGENET)
            ...                                     # forward, backward, step

A run started by ``ladle sweep`` finds its feed in ``$LADLE_SOCKET`` and its name in
``$LADLE_RUN``: ``ladle.Consumer(batch_size=128)`` (no socket) joins that feed, and raises
:class:`ConnectError` naming ``LADLE_SOCKET`` when it is unset.

A sample is a record of named fields (the feed's schema, ``consumer.schema``): ``batch["wave"]``
is field ``wave`` of every sample, ``[B, ...shape]``; ``batch.keys()`` names them. An image
feed's ``batch.images`` ([B, H, W, 3] uint8) and ``batch.labels`` ([B] int64) are its
``image`` and ``label`` fields. All are read-only views of the shared ring:
``numpy.asarray(batch["wave"])`` and ``torch.from_dlpack(batch.images)`` copy nothing.

**DDP.** ``ladle.Consumer(sock, 128, group="job")`` in each rank of a torchrun job (rank
and world size from ``$RANK`` and ``$WORLD_SIZE``) reads that rank's share of each epoch, as
``DistributedSampler`` would deal it: every rank the same number of samples, together the
whole epoch. A rank that dies stops the others with :class:`GroupBroken`.

**Checkpoints.** ``consumer.state_dict()`` is a plain dict to save beside the model's;
``ladle.Consumer(sock, 128, state=saved)`` (or ``load_state_dict``) resumes exactly: the
interrupted epoch delivers just the samples it had not, then whole epochs follow. It is
checked against the feed (dataset, seed, transform) and the group and rank::

    consumer = ladle.Consumer(sock, 128, group="job", state=ckpt.get("data"))
    ...
    torch.save({"model": model.state_dict(), "data": consumer.state_dict()}, path)

To serve a dataset of your own from Python (your ``torch.utils.data.Dataset``, audio,
tabular rows), see :func:`serve` and :class:`Producer`, or ``python -m ladle serve``.

**The holding rule.** A batch's samples stay reserved (the producer will not overwrite them,
and waits for them) until the batch *and every view, array and tensor made from it* are
gone, unless the consumer holds the feed back for the producer's stall timeout (10 s by
default) without taking a batch: then it is let go and the batches it holds may be
overwritten (``batch.intact`` turns False; it rejoins by itself). A consumer that holds the
others back is asked to skim: it reads on from the batch after those it holds, which stop
holding the feed back and may then be overwritten too (``batch.intact`` says so). A consumer
may hold at most ``max_batches_held`` batches (default 8); asking for one more, or keeping one
batch while a whole ring of later ones is read, raises :class:`TooManyBatchesHeld`. In the
usual loop only the current batch is held.
Copy (``to_torch``, ``numpy.array``, ``tensor.clone()``) what must outlive the step.
"""

from importlib.metadata import PackageNotFoundError, version

from ._native import (
    PROTOCOL_VERSION,
    ArrayView,
    Batch,
    ConnectError,
    Consumer,
    Detached,
    Epoch,
    GroupBroken,
    GroupIncomplete,
    LadleError,
    ProducerEnded,
    ProducerGone,
    TooManyBatchesHeld,
)
from ._feeds import Feed, feed, feed_stats
from ._producer import Producer, serve
from ._torch import IMAGENET, to_torch

try:
    __version__ = version("ladle")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "PROTOCOL_VERSION",
    "IMAGENET",
    "ArrayView",
    "Batch",
    "ConnectError",
    "Consumer",
    "Detached",
    "Epoch",
    "Feed",
    "GroupBroken",
    "GroupIncomplete",
    "LadleError",
    "ProducerEnded",
    "Producer",
    "ProducerGone",
    "TooManyBatchesHeld",
    "feed",
    "feed_stats",
    "serve",
    "to_torch",
]

"""torch interop: DLPack without a copy, and ``to_torch`` against a numpy reference.
Skipped when torch is not installed (CI installs numpy and pytest only)."""

from __future__ import annotations

import numpy as np
import pytest

import ladle

from conftest import IMAGE

torch = pytest.importorskip("torch")


def test_from_dlpack_shares_the_ring(producer):
    consumer = ladle.Consumer(producer.socket, 16)
    batch = next(iter(consumer))
    images = torch.from_dlpack(batch.images)
    labels = torch.from_dlpack(batch.labels)
    assert images.dtype == torch.uint8 and tuple(images.shape) == (16, IMAGE, IMAGE, 3)
    assert labels.dtype == torch.int64 and tuple(labels.shape) == (16,)
    assert images.data_ptr() == batch.images.data_ptr
    assert np.array_equal(images.numpy(), np.asarray(batch.images))
    del batch
    assert consumer.held_batches == 1, "the tensor keeps the batch held"
    del images, labels
    assert consumer.held_batches == 0


@pytest.mark.parametrize("channels_last", [False, True])
def test_to_torch_matches_a_numpy_reference(producer, channels_last):
    consumer = ladle.Consumer(producer.socket, 16)
    batch = next(iter(consumer))
    mean, std = ladle.IMAGENET
    images, labels = batch.to_torch("cpu", normalize=ladle.IMAGENET, channels_last=channels_last)
    raw = np.asarray(batch.images).astype(np.float32) / 255.0
    expected = (raw - np.array(mean, np.float32)) / np.array(std, np.float32)
    expected = expected.transpose(0, 3, 1, 2)
    assert tuple(images.shape) == (16, 3, IMAGE, IMAGE) and images.dtype == torch.float32
    assert images.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    np.testing.assert_allclose(images.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert np.array_equal(labels.numpy(), np.asarray(batch.labels))
    del batch
    assert consumer.held_batches == 0, "to_torch results must not hold the ring"


def test_to_torch_without_normalize_scales_to_unit_range(producer):
    consumer = ladle.Consumer(producer.socket, 4)
    batch = next(iter(consumer))
    images, _ = batch.to_torch()
    assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    np.testing.assert_allclose(
        images.numpy(), np.asarray(batch.images).transpose(0, 3, 1, 2) / 255.0, atol=1e-6
    )


def test_to_torch_rejects_a_malformed_normalize(producer):
    consumer = ladle.Consumer(producer.socket, 4)
    batch = next(iter(consumer))
    with pytest.raises(ValueError, match="normalize"):
        batch.to_torch(normalize=((0.5, 0.5), (0.5, 0.5)))
    with pytest.raises(ValueError, match="normalize"):
        batch.to_torch(normalize=((0.5, 0.5, 0.5), (0.0, 1.0, 1.0)))


def test_to_torch_of_a_multi_field_feed_gives_every_field(tmp_path):
    from pydatasets import Mixed

    sock = tmp_path / "mixed.sock"
    dataset = Mixed()
    with ladle.Producer(dataset, sock, workers=1, ring_mib=16):
        consumer = ladle.Consumer(sock, batch_size=16)
        batch = next(iter(consumer))
        indices = np.asarray(batch.indices).tolist()
        out = batch.to_torch(normalize=None)
        assert sorted(out) == sorted(batch.keys())
        assert tuple(out["image"].shape) == (16, 3, 8, 8) and out["image"].dtype == torch.float32
        expected_image = np.stack([dataset[i]["image"] for i in indices]).transpose(0, 3, 1, 2) / 255
        np.testing.assert_allclose(out["image"].numpy(), expected_image, rtol=1e-6)
        for name in ("half", "mask", "length", "small", "score", "label"):
            expected = np.stack([np.asarray(dataset[i][name]) for i in indices])
            np.testing.assert_array_equal(out[name].numpy(), expected, err_msg=name)
        del batch
        assert consumer.held_batches == 0, "to_torch results must not hold the ring"


def test_a_dataset_of_torch_tensors_serves_bfloat16_through_dlpack(tmp_path):
    from pydatasets import TorchSamples

    sock = tmp_path / "t.sock"
    dataset = TorchSamples()
    with ladle.Producer(dataset, sock, workers=1, ring_mib=16) as producer:
        assert producer.schema == "x: bf16[4], chw: f32[3, 2, 2], label: i64"
        consumer = ladle.Consumer(sock, batch_size=8)
        for batch in consumer:
            x = torch.from_dlpack(batch["x"])
            assert x.dtype == torch.bfloat16
            for k, i in enumerate(np.asarray(batch.indices).tolist()):
                assert torch.equal(x[k], dataset[i]["x"])
                assert torch.equal(torch.from_dlpack(batch["chw"])[k], dataset[i]["chw"])

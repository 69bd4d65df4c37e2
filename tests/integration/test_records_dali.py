"""decode="dali": a records dataset's bytes read by stoker's reader and decoded by NVIDIA
DALI in the loader's process, through DALI's CPU backend here (its GPU backend where a
GPU is), against stoker's own decoder: the same samples, labels, crops and flips, the
pixels to within rounding; exact resume; the fallback without DALI or a GPU; a bad
image named or skipped."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

from .helpers import one_rank, photo_jpeg, photo_records  # noqa: F401 (one_rank: a fixture)

N, B, SIZE = 96, 8, 48
try:
    HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None
except ImportError:  # (no nvidia namespace at all)
    HAS_DALI = False
needs_dali = pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")


pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_records(tmp_path_factory.mktemp("images") / "ds", N, 4, (60, 200), (3, 7), 40_000)


def dataset(root: Path, **kw: object) -> stoker.RecordDataset:
    kw.setdefault("batch_size", B)
    kw.setdefault("image_size", SIZE)
    return stoker.RecordDataset(str(root), seed=5, **kw)  # type: ignore[arg-type]


def by_sample(batches: list[dict[str, torch.Tensor]]) -> dict[int, tuple[torch.Tensor, int]]:
    return {
        int(i): (b["image"][j], int(b["label"][j]))
        for b in batches
        for j, i in enumerate(b["sample_id"].tolist())
    }


@needs_dali
def test_dali_decodes_the_samples_stokers_decoder_does_to_within_rounding(images: Path) -> None:
    ours = by_sample(list(stoker.TokenLoader(dataset(images), 0)))
    for nw in (0, 2):
        ds = dataset(images, decode="dali", dali_device="cpu")
        assert ds.decode == "dali"
        batches = list(stoker.TokenLoader(ds, nw))
        assert all(set(b) == {"image", "label", "sample_id"} for b in batches)
        got = by_sample(batches)
        assert sorted(got) == list(range(N))
        diffs = []
        for sid, (img, label) in got.items():
            want, want_label = ours[sid]
            assert img.dtype == torch.uint8 and img.shape == (3, SIZE, SIZE)
            assert label == want_label == (sid * 3) % 7
            diffs.append((img.float() - want.float()).abs().mean().item())
        # the same crop and flip (a wrong box or flip would be tens of levels off), the
        # pixels differing by the decoders' and resizes' rounding
        assert np.mean(diffs) < 1.5 and max(diffs) < 6, (np.mean(diffs), max(diffs))
        assert ds.batch_stage() is not None and ds.batch_stage().rescued == 0  # type: ignore[union-attr]


@needs_dali
def test_a_wrong_flip_would_show(images: Path) -> None:
    """(The bound above separates a right crop from a wrong one.)"""
    ours = by_sample(list(stoker.TokenLoader(dataset(images), 0)))
    got = by_sample(list(stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 0)))
    flipped = [(got[s][0].flip(-1).float() - ours[s][0].float()).abs().mean().item() for s in got]
    assert np.mean(flipped) > 3 * 1.5


@needs_dali
@pytest.mark.parametrize("at", [2, 7])
def test_a_resumed_dali_run_is_bit_identical(images: Path, at: int) -> None:
    whole = list(stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 2))
    loader = stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 2)
    it = iter(loader)
    head = [next(it) for _ in range(at)]
    state = loader.state_dict()
    it.close()
    again = stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 0)
    again.load_state_dict(state)
    rest = list(again)
    assert len(head) + len(rest) == len(whole)
    for a, b in zip(head + rest, whole, strict=True):
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@needs_dali
def test_the_device_tier_hands_over_dalis_images(images: Path) -> None:
    plain = list(stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 2))
    loader = stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 2, device="cpu")
    try:
        through = [{k: v.clone() for k, v in b.items()} for b in loader]
    finally:
        loader.close()
    assert len(through) == len(plain)
    for a, b in zip(through, plain, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


@needs_dali
def test_torch_dataloader_batches_go_through_finish_batches(images: Path) -> None:
    from torch.utils.data import DataLoader

    ds = dataset(images, decode="dali", dali_device="cpu")
    ds.set_epoch(0)
    dl = list(ds.finish_batches(iter(DataLoader(ds, batch_size=B, num_workers=2))))
    mine = list(stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), 0))
    assert [b["sample_id"].tolist() for b in dl] == [b["sample_id"].tolist() for b in mine]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(dl, mine, strict=True))


def bad_rows(tmp_path: Path, bad: tuple[int, ...] = (5, 13, 26)) -> tuple[Path, set[int]]:
    rng = np.random.default_rng(6)
    rows = [{"image": photo_jpeg(rng, 64, 80), "label": i % 5} for i in range(40)]
    if 5 in bad:
        rows[5]["image"] = rows[5]["image"][: len(rows[5]["image"]) // 2]  # truncated
    if 13 in bad:
        rows[13]["image"] = b"not an image"
    if 26 in bad:
        # a JPEG whose header reads and whose end marker is there, with a Huffman table
        # no decoder takes (its 16 code counts: far more than 256 codes): DALI fails
        # the batch it is in
        body = bytearray(rows[26]["image"])
        dht = body.index(b"\xff\xc4")
        body[dht + 5 : dht + 21] = b"\xff" * 16
        rows[26]["image"] = bytes(body)
    stoker.write_records(rows, str(tmp_path / "bad"), schema={"image": "binary", "label": "int64"},
                         block_bytes=5_000)  # fmt: skip
    return tmp_path / "bad", set(bad)


@needs_dali
def test_bad_images_are_named_or_skipped_and_nothing_else_is_lost(tmp_path: Path) -> None:
    from stoker.observe.registry import registry

    root, bad = bad_rows(tmp_path)
    for nw in (0, 2):
        before = registry().snapshot()["images"]["skipped"]
        ds = dataset(root, decode="dali", dali_device="cpu", on_error="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = stoker.TokenLoader(ds, nw)
            batches = list(loader)
        assert [len(b["sample_id"]) for b in batches] == [B] * (40 // B)
        skipped = {
            i for b in batches for i, s in zip(b["sample_id"].tolist(), b["skipped"].tolist()) if s
        }
        assert skipped == bad
        for b in batches:
            s = b["skipped"]
            assert (b["label"][s] == -100).all() and not b["image"][s].any()
            assert (b["label"][~s] == b["sample_id"][~s] % 5).all()
            assert b["image"][~s].float().std() > 5
        assert loader.stats()["images"]["skipped"] - before == len(bad)
        stage = ds.batch_stage()
        assert stage is not None and stage.rescued >= 1  # DALI failed on row 26's batch


@needs_dali
@pytest.mark.parametrize("row", [5, 13, 26])
def test_the_default_names_a_bad_image_by_row_block_and_file(tmp_path: Path, row: int) -> None:
    root, _ = bad_rows(tmp_path, (row,))
    src = stoker.RecordSource(str(root))
    block = int(src.block_of(np.array([row]))[0])
    for nw in (0, 2):
        # (DALI fails on row 26's batch: said once, with DALI's own words)
        said = pytest.warns(RuntimeWarning, match="DALI failed on a batch")
        with pytest.raises(stoker.ImageError) as info, said if row == 26 else nullcontext():
            list(stoker.TokenLoader(dataset(root, decode="dali", dali_device="cpu"), nw))
        assert f"row {row} (block {block})" in str(info.value)
        assert src.manifest.block_file(block).path in str(info.value)


@needs_dali
@pytest.mark.parametrize("row", [5, 26])
@pytest.mark.parametrize("decode", ["dali", True])
def test_a_state_taken_after_a_bad_image_reads_its_batch_again(
    tmp_path: Path, row: int, decode: object
) -> None:
    # row 5 goes to stoker's decoder at once (no end marker), row 26 after DALI failed
    # on its batch: both raise in the loader's process with decode="dali", after the
    # batch was taken from the workers; in a worker with decode=True
    root, _ = bad_rows(tmp_path, (row,))
    for nw in (0, 2):
        loader = stoker.TokenLoader(dataset(root, decode=decode, dali_device="cpu"), nw)
        head = []
        with warnings.catch_warnings(), pytest.raises(stoker.ImageError):
            warnings.simplefilter("ignore")
            for b in loader:
                head.append(b["sample_id"].tolist())
        state = loader.state_dict()
        again = stoker.TokenLoader(dataset(root, decode=decode, dali_device="cpu",
                                           on_error="skip"), nw)  # fmt: skip
        again.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rest = list(again)
        ids = [i for b in head for i in b] + [i for b in rest for i in b["sample_id"].tolist()]
        assert sorted(ids) == list(range(40))  # the bad batch's good samples too
        assert row in {i for b in rest for i in b["sample_id"][b["skipped"]].tolist()}


@needs_dali
def test_an_interrupt_in_the_decode_leaves_its_batch_to_be_read_again(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while DALI decodes a batch in the loader's process, then a checkpoint: the
    # batch it interrupted is read again after the restore
    from stoker.records.dali import DaliDecode

    real, calls = DaliDecode.decode, [0]

    def interrupted(self: DaliDecode, batch: dict) -> dict:
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(self, batch)

    for nw in (0, 2):
        calls[0] = 0
        monkeypatch.setattr(DaliDecode, "decode", interrupted)
        loader = stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), nw)
        head = []
        with pytest.raises(KeyboardInterrupt):
            for b in loader:
                head.append(b["sample_id"].tolist())
        state = loader.state_dict()
        monkeypatch.setattr(DaliDecode, "decode", real)
        again = stoker.TokenLoader(dataset(images, decode="dali", dali_device="cpu"), nw)
        again.load_state_dict(state)
        rest = [b["sample_id"].tolist() for b in again]
        assert len(head) == 2
        ids = [i for b in head + rest for i in b]
        assert sorted(ids) == list(range(N))


def test_without_dali_it_decodes_on_the_cpu_after_one_warning(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # (import fails: not installed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = dataset(images, decode="dali")
        batches = list(stoker.TokenLoader(ds, 2))
    said = [str(w.message) for w in caught if "decode='dali'" in str(w.message)]
    assert len(said) == 1 and "not installed" in said[0]
    assert ds.decode is True and ds.batch_stage() is None
    plain = list(stoker.TokenLoader(dataset(images), 2))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(batches, plain, strict=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there")
def test_without_a_gpu_dali_gpu_decodes_on_the_cpu_after_one_warning(images: Path) -> None:
    with pytest.warns(RuntimeWarning, match="no CUDA device"):
        ds = dataset(images, decode="dali")
    assert ds.decode is True


@needs_dali
def test_dali_refuses_what_it_cannot_do(images: Path) -> None:
    with pytest.raises(stoker.ConfigError, match="dali_device"):
        dataset(images, decode="dali", dali_device="tpu")
    with pytest.raises(stoker.ConfigError, match="no transform"):
        dataset(images, decode="dali", dali_device="cpu", transform=lambda img, rng: img)
    with pytest.raises(stoker.ConfigError, match="hold='images'"):
        dataset(images, decode="dali", dali_device="cpu", hold="images")
    with pytest.raises(stoker.ConfigError, match="decode must be"):
        dataset(images, decode="nvjpeg")
    with pytest.raises(stoker.ConfigError, match="decode='dali'"):
        one = dataset(images, decode="dali", dali_device="cpu", batch_size=1)
        stoker.Mixture(
            {"a": one, "b": dataset(images, batch_size=1)}, {"a": 0.5, "b": 0.5}, batch_size=B
        )


@pytest.mark.gpu
@needs_dali
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dali_on_the_gpu_hands_over_gpu_images_as_the_cpu_decodes(images: Path) -> None:
    ours = by_sample(list(stoker.TokenLoader(dataset(images), 0)))
    ds = dataset(images, decode="dali")
    batches = list(stoker.TokenLoader(ds, 2))
    assert all(b["image"].is_cuda for b in batches)
    got = by_sample(batches)
    assert sorted(got) == list(range(N))
    diffs = [
        (img.cpu().float() - ours[s][0].float()).abs().mean().item() for s, (img, _) in got.items()
    ]
    assert np.mean(diffs) < 2.5 and max(diffs) < 10, (np.mean(diffs), max(diffs))

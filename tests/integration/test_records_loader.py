"""stoker.RecordDataset through the one reading pipeline: every image once an epoch with
its label, fixed-shape uint8 batches from worker slots, the same crops whatever the
workers, ranks or restarts (bit-identical resume), torch's DataLoader, the coordinator,
a mixture, and a bad image named by row, block and file."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import stoker

from .helpers import one_rank, photo_jpeg, photo_records, same_batches  # noqa: F401 (one_rank: a fixture)

N, B, SIZE = 150, 8, 32


pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_records(tmp_path_factory.mktemp("images") / "ds", N, 1, (40, 160), (7, 10), 30_000)


def dataset(root: Path, **kw: object) -> stoker.RecordDataset:
    kw.setdefault("batch_size", B)
    kw.setdefault("image_size", SIZE)
    return stoker.RecordDataset(str(root), seed=3, **kw)  # type: ignore[arg-type]


def ids(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    return [i for b in batches for i in b["sample_id"].tolist()]


same = same_batches


def test_every_image_once_an_epoch_with_its_label_whatever_the_workers(images: Path) -> None:
    runs = []
    for nw in (0, 2):
        loader = stoker.TokenLoader(dataset(images), nw)
        first = list(loader)
        counted = loader.stats()["samples"]  # (the process's figures: every loader's)
        second = list(loader)
        for epoch in (first, second):
            assert sorted(ids(epoch)) == list(range(N))
            for b in epoch:
                assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (3, SIZE, SIZE)
                assert (b["label"] == (b["sample_id"] * 7) % 10).all()
        assert ids(first) != ids(second)  # a fresh shuffle an epoch
        stats = loader.stats()
        assert stats["samples"] - counted == N and stats["samples_per_second"] > 0
        runs.append((first, second))
    assert same(runs[0][0], runs[1][0]) and same(runs[0][1], runs[1][1])
    # a sample's crop differs from one epoch to the next, and is the same in one epoch
    one = {int(i): b["image"][j] for b in runs[0][0] for j, i in enumerate(b["sample_id"])}
    two = {int(i): b["image"][j] for b in runs[0][1] for j, i in enumerate(b["sample_id"])}
    assert sum(not torch.equal(one[i], two[i]) for i in range(N)) > 0.9 * N


def test_the_images_are_the_stored_ones_cropped(images: Path) -> None:
    """With augment="resize" each image is its stored JPEG resized: exactly as Pillow does
    it with decoder="pillow", to within a few levels of it with OpenCV's."""
    src = stoker.RecordSource(str(images))
    opencv = list(stoker.TokenLoader(dataset(images, augment="resize", decoder="opencv"), 0))
    batches = list(stoker.TokenLoader(dataset(images, augment="resize", decoder="pillow"), 0))
    for a, b in zip(opencv, batches, strict=True):
        diff = (a["image"].int() - b["image"].int()).abs().float()
        assert diff.mean() < 3 and torch.equal(a["sample_id"], b["sample_id"])
    for b in batches[:3]:
        for j, sid in enumerate(b["sample_id"].tolist()):
            data = src.rows([sid]).column("image")[0].as_py()
            img = Image.open(io.BytesIO(data))
            if min(img.size) >= 2 * SIZE:  # decoded at a reduced size (libjpeg's DCT scaling)
                img.draft("RGB", (SIZE, SIZE))
            want = np.asarray(img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
            got = b["image"][j].numpy().transpose(1, 2, 0)
            assert (got == want).all()
    eval_a = list(stoker.TokenLoader(dataset(images, augment="eval"), 0))
    eval_b = list(stoker.TokenLoader(dataset(images, augment="eval"), 0))
    assert same(eval_a, eval_b)


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("at", [3, 11])
def test_a_resumed_run_is_bit_identical(images: Path, nw: int, at: int) -> None:
    whole = list(stoker.TokenLoader(dataset(images), nw))
    loader = stoker.TokenLoader(dataset(images), nw)
    it = iter(loader)
    head = [next(it) for _ in range(at)]
    state = loader.state_dict()
    it.close()
    again = stoker.TokenLoader(dataset(images), 2 - nw)  # another number of workers
    again.load_state_dict(state)
    assert same(head + list(again), whole)


def test_two_ranks_share_an_epoch_and_crop_as_one_would(images: Path) -> None:
    one = {}
    for b in stoker.TokenLoader(dataset(images, rank=0, world_size=1), 0):
        for j, i in enumerate(b["sample_id"].tolist()):
            one[i] = b["image"][j]
    seen = []
    for rank in (0, 1):
        batches = list(stoker.TokenLoader(dataset(images, rank=rank, world_size=2), 0))
        seen.append(ids(batches))
        for b in batches:
            for j, i in enumerate(b["sample_id"].tolist()):
                assert torch.equal(b["image"][j], one[i])  # the crop is the sample's
    assert len(seen[0]) == len(seen[1]) and not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) >= set(range(N - 1))


def test_torch_dataloader_workers_give_the_loaders_batches(images: Path) -> None:
    ds = dataset(images)
    ds.set_epoch(0)
    dl = list(DataLoader(ds, batch_size=B, num_workers=2))
    mine = list(stoker.TokenLoader(dataset(images), 0))
    assert same(dl, mine)


def test_a_coordinator_feeds_records_exactly_once(images: Path) -> None:
    loader = stoker.TokenLoader(dataset(images), 2, coordinator="rank0")
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert sorted(ids(batches)) == list(range(N))
    for b in batches:
        assert (b["label"] == (b["sample_id"] * 7) % 10).all()


def small_records(root: Path, n: int) -> Path:
    """``n`` images labelled 100 + their row, in a dataset of their own."""
    rng = np.random.default_rng(5)
    stoker.write_records(
        [{"image": photo_jpeg(rng, 50, 70), "label": 100 + i} for i in range(n)],
        str(root), schema={"image": "binary", "label": "int64"}, block_bytes=20_000,
    )  # fmt: skip
    return root


def test_records_mix_with_records(images: Path, tmp_path: Path) -> None:
    small_records(tmp_path / "small", 40)
    mix = stoker.Mixture(
        {"big": dataset(images, batch_size=1), "small": dataset(tmp_path / "small", batch_size=1)},
        {"big": 0.75, "small": 0.25},
        batch_size=B,
    )
    batches = list(stoker.TokenLoader(mix, 0))
    for b in batches:
        assert b["image"].shape[1:] == (3, SIZE, SIZE)
        assert int((b["source"] == 1).sum()) == B // 4
        small = b["source"] == 1
        assert (b["label"][small] >= 100).all() and (b["label"][~small] < 10).all()


def test_a_small_records_sources_repeats_in_a_mixture_epoch_get_fresh_crops(
    images: Path, tmp_path: Path
) -> None:
    from stoker.mixture.stream import decode, source_epochs

    small_records(tmp_path / "small", 24)

    def mixture() -> stoker.Mixture:
        return stoker.Mixture(
            {
                "big": dataset(images, batch_size=1),
                "small": dataset(tmp_path / "small", batch_size=1),
            },
            {"big": 0.5, "small": 0.5},
            batch_size=B,
        )  # (an epoch: the big source's 150 samples, so the small one's 24 about 6 times)

    batches = list(stoker.TokenLoader(mixture(), 0))
    crops: dict[tuple[int, int], torch.Tensor] = {}
    for b in batches:
        src, ids = decode(b["sample_id"].numpy())
        epochs = source_epochs(b["sample_id"].numpy())
        for j in np.flatnonzero(src == 1).tolist():
            assert int(b["label"][j]) == 100 + int(ids[j])
            crops[(int(epochs[j]), int(ids[j]))] = b["image"][j]
    repeats = sorted({e for e, _ in crops})
    assert len(repeats) >= 3  # the small source ran epochs of its own
    for e in repeats[:-1]:  # each whole repeat: every sample once
        assert sorted(i for ee, i in crops if ee == e) == list(range(24))
    # a sample's crop differs from one of the source's epochs to the next
    a, b2 = repeats[0], repeats[1]
    assert sum(not torch.equal(crops[(a, i)], crops[(b2, i)]) for i in range(24)) > 0.8 * 24
    # the same with workers
    again = list(stoker.TokenLoader(mixture(), 2))
    assert same(again, batches)


def test_a_bad_image_is_named_by_row_block_and_file(images: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = [{"image": photo_jpeg(rng, 40, 40), "label": 1} for _ in range(30)]
    rows[17]["image"] = rows[17]["image"][: len(rows[17]["image"]) // 2]  # truncated
    stoker.write_records(rows, str(tmp_path / "bad"), schema={"image": "binary", "label": "int64"},
                         block_bytes=5_000)  # fmt: skip
    src = stoker.RecordSource(str(tmp_path / "bad"))
    block = int(src.block_of(np.array([17]))[0])
    for nw in (0, 1):
        with pytest.raises(stoker.DatasetError) as info:
            list(stoker.TokenLoader(dataset(tmp_path / "bad"), nw))
        text = str(info.value)
        assert f"row 17 (block {block})" in text
        assert "does not decode" in text or "not an image" in text
        assert src.manifest.block_file(block).path in text


def test_bad_configurations_are_refused(images: Path) -> None:
    with pytest.raises(stoker.ConfigError, match="augment"):
        dataset(images, augment="random")
    with pytest.raises(stoker.ConfigError, match="image_column 'label'"):
        dataset(images, image_column="label")
    with pytest.raises(stoker.ConfigError, match="label_column 'image'"):
        dataset(images, label_column="image")
    assert "label" not in dataset(images, label_column=False).layout


def test_the_device_tier_hands_over_the_loaders_images(images: Path) -> None:
    plain = list(stoker.TokenLoader(dataset(images), 2))
    loader = stoker.TokenLoader(dataset(images), 2, device="cpu")
    try:
        through = [{k: v.clone() for k, v in b.items()} for b in loader]
    finally:
        loader.close()
    assert same(through, plain) and through[0]["image"].dtype == torch.uint8


def seeded_crop(image: object, rng: np.random.Generator) -> np.ndarray:
    """A user's transform: a random SIZE x SIZE window of the decoded image (padded)."""
    a = np.asarray(image)
    a = np.pad(a, ((0, max(0, SIZE - a.shape[0])), (0, max(0, SIZE - a.shape[1])), (0, 0)))
    top = int(rng.integers(0, a.shape[0] - SIZE + 1))
    left = int(rng.integers(0, a.shape[1] - SIZE + 1))
    return a[top : top + SIZE, left : left + SIZE]


def test_a_users_transform_gets_a_generator_seeded_by_epoch_and_sample(images: Path) -> None:
    runs = [list(stoker.TokenLoader(dataset(images, transform=seeded_crop), nw)) for nw in (0, 2)]
    assert same(runs[0], runs[1])
    loader = stoker.TokenLoader(dataset(images, transform=seeded_crop), 0)
    first, second = list(loader), list(loader)
    one = {int(i): b["image"][j] for b in first for j, i in enumerate(b["sample_id"])}
    two = {int(i): b["image"][j] for b in second for j, i in enumerate(b["sample_id"])}
    assert sum(not torch.equal(one[i], two[i]) for i in range(N)) > 0.8 * N
    with pytest.raises(stoker.ImageError, match=r"the transform gave uint8 of shape \(5, 5, 3\)"):
        list(
            stoker.TokenLoader(
                dataset(images, transform=lambda img, rng: np.zeros((5, 5, 3), np.uint8)), 0
            )
        )


class TorchCrop(torch.nn.Module):
    """A transform as torchvision's are: a module of the image alone, drawing its random
    choices from torch's generator (a random SIZE x SIZE window, flipped for half)."""

    def forward(self, image: object) -> torch.Tensor:
        a = torch.from_numpy(np.array(image)).permute(2, 0, 1)
        a = torch.nn.functional.pad(a, (0, max(0, SIZE - a.shape[2]), 0, max(0, SIZE - a.shape[1])))
        top = int(torch.randint(0, a.shape[1] - SIZE + 1, ()))
        left = int(torch.randint(0, a.shape[2] - SIZE + 1, ()))
        out = a[:, top : top + SIZE, left : left + SIZE]
        return out.flip(-1) if float(torch.rand(())) < 0.5 else out


def test_a_torch_transform_draws_the_samples_own_choices(images: Path) -> None:
    before = torch.random.get_rng_state()
    runs = [list(stoker.TokenLoader(dataset(images, transform=TorchCrop()), nw)) for nw in (0, 2)]
    assert torch.equal(torch.random.get_rng_state(), before)  # torch's generator restored
    assert same(runs[0], runs[1])  # whatever the workers (and the decode threads at 0)
    loader = stoker.TokenLoader(dataset(images, transform=TorchCrop()), 0)
    first, second = list(loader), list(loader)
    one = {int(i): b["image"][j] for b in first for j, i in enumerate(b["sample_id"])}
    two = {int(i): b["image"][j] for b in second for j, i in enumerate(b["sample_id"])}
    assert sum(not torch.equal(one[i], two[i]) for i in range(N)) > 0.8 * N
    # a resumed run makes the same choices
    loader = stoker.TokenLoader(dataset(images, transform=TorchCrop()), 2)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    state = loader.state_dict()
    it.close()
    again = stoker.TokenLoader(dataset(images, transform=TorchCrop()), 0)
    again.load_state_dict(state)
    assert same(head + list(again), runs[0])
    # a function of the image alone is called the same way
    fn = list(stoker.TokenLoader(dataset(images, transform=lambda img: TorchCrop()(img)), 2))
    assert same(fn, runs[0])


def test_undecoded_bytes_cross_from_workers_in_fixed_rows(images: Path) -> None:
    src = stoker.RecordSource(str(images))
    stored = src.rows(range(N)).column("image").to_pylist()
    longest = max(map(len, stored))
    batches = list(stoker.TokenLoader(dataset(images, decode=False, max_bytes=longest), 2))
    assert sorted(ids(batches)) == list(range(N))
    for b in batches:
        assert b["data"].shape[1:] == (longest,) and "image" not in b
        for j, sid in enumerate(b["sample_id"].tolist()):
            n = int(b["length"][j])
            assert bytes(b["data"][j, :n].numpy()) == stored[sid]
            assert not b["data"][j, n:].any()
    with pytest.raises(stoker.ImageError, match=rf"bytes, more than max_bytes \({longest - 1}\)"):
        list(stoker.TokenLoader(dataset(images, decode=False, max_bytes=longest - 1), 0))


def test_on_error_skip_keeps_every_batch_and_counts_the_skipped(tmp_path: Path) -> None:
    from stoker.observe.registry import registry

    rng = np.random.default_rng(3)
    rows = [{"image": photo_jpeg(rng, 40, 40), "label": i % 5} for i in range(40)]
    rows[7]["image"] = rows[7]["image"][: len(rows[7]["image"]) // 2]  # truncated
    rows[21]["image"] = b"not an image"
    rows[30]["label"] = None  # a missing label
    stoker.write_records(rows, str(tmp_path / "bad"), schema={"image": "binary", "label": "int64"},
                         block_bytes=5_000)  # fmt: skip
    bad = {7, 21, 30}
    for nw in (0, 2):
        for hold in ("blocks", "images"):
            before = registry().snapshot()["images"]["skipped"]
            ds = dataset(tmp_path / "bad", on_error="skip", hold=hold)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loader = stoker.TokenLoader(ds, nw)
                batches = list(loader)
            if nw == 0:  # (a worker's warning is its own process's)
                assert sum("skipped" in str(w.message) for w in caught) == 1  # once, named
                assert "row " in str(next(w for w in caught if "skipped" in str(w.message)).message)
            assert [len(b["sample_id"]) for b in batches] == [B] * (40 // B)  # none shorter
            assert sorted(ids(batches)) == list(range(40))  # nothing else lost
            skipped = {
                i
                for b in batches
                for i, s in zip(b["sample_id"].tolist(), b["skipped"].tolist())
                if s
            }
            assert skipped == bad
            for b in batches:
                s = b["skipped"]
                assert (b["label"][s] == -100).all() and not b["image"][s].any()
                assert (b["label"][~s] == b["sample_id"][~s] % 5).all()
                assert b["image"][~s].float().std() > 5  # (the others decoded)
            assert loader.stats()["images"]["skipped"] - before == 3
    with pytest.raises(stoker.DatasetError, match="row 7"):  # the default names it
        list(stoker.TokenLoader(dataset(tmp_path / "bad", shuffle=False), 0))
    with pytest.raises(stoker.ConfigError, match="on_error"):
        dataset(tmp_path / "bad", on_error="ignore")


def test_what_a_worker_would_import_each_pass_is_imported_with_the_dataset(
    images: Path, tmp_path: Path
) -> None:
    # numpy's np.unique imports numpy.ma on its first call, and the decoder is OpenCV: a
    # worker forked for a pass from a process without them imported them again, every
    # pass (0.1-0.15 s before its first batch); made in a fresh interpreter, the datasets
    # import them in the process that forks the workers
    import subprocess
    import sys

    from .helpers import write_dataset

    tokens = write_dataset(tmp_path / "tokens").path
    code = (
        "import sys, stoker\n"
        f"stoker.TokenDataset({str(tokens)!r}, 16, batch_size=4)\n"
        "print('numpy.ma' in sys.modules)\n"
        f"stoker.RecordDataset({str(images)!r}, image_size=16, batch_size=4)\n"
        "print('cv2' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
    # and only imported: OpenCV's threads, which the user's own OpenCV code in this
    # process uses, are left as they were (the reader sets its own where it decodes)
    code = (
        "import cv2, stoker\n"
        "n = cv2.getNumThreads()\n"
        f"stoker.RecordDataset({str(images)!r}, image_size=16, batch_size=4)\n"
        "print(n > 0, cv2.getNumThreads() == n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


class _Inline:
    """An executor that runs each task at once (fetches counted without races)."""

    def submit(self, fn: object, *args: object) -> object:
        from concurrent.futures import Future

        f: Future = Future()
        f.set_result(fn(*args))  # type: ignore[operator]
        return f

    def shutdown(self, **kw: object) -> None:
        pass


def test_a_pass_fetches_each_block_about_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the spread order deals a unit's rows over many turns, its last ones a few a turn:
    # planned over the whole spread, a block's last rows kept alone when it goes, a pass
    # fetches a block a second time only where it spans two units (planned over 8 turns
    # and held to its last planned use, each block was fetched 3-4.6 times a pass); the
    # samples are the same with nothing kept alone (each block held to its last use)
    from stoker.records import reader as rr

    root = photo_records(tmp_path / "ds", 2000, 2, (24, 40), (7, 10), 40_000)
    monkeypatch.setattr(rr.RecordReader, "_pool", lambda self: _Inline())
    fetched: list[int] = []
    real = rr.RecordReader._fetch

    def counted(self: rr.RecordReader, b: int) -> object:
        fetched.append(b)
        return real(self, b)

    monkeypatch.setattr(rr.RecordReader, "_fetch", counted)
    runs = {}
    for budget in (rr.KEPT_BYTES, 0):
        monkeypatch.setattr(rr, "KEPT_BYTES", budget)
        fetched.clear()
        ds = stoker.RecordDataset(str(root), image_size=16, batch_size=8, seed=1)
        runs[budget] = ([b["image"].clone() for b in stoker.TokenLoader(ds, 0)], len(fetched))
    blocks = stoker.RecordSource(str(root)).manifest.num_blocks
    (kept, n_kept), (held, _) = runs[rr.KEPT_BYTES], runs[0]
    assert all(torch.equal(a, b) for a, b in zip(kept, held, strict=True))
    assert len(set(fetched)) == blocks and n_kept <= 1.6 * blocks

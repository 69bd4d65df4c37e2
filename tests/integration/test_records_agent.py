"""Records through the node agent, a real process, from a real origin (nginx): a block
fetched once per node, images decoded once per node and not again in the next epoch,
the same pixels as without the agent (with room or without), a bad image named."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker.records.held import View

from .helpers import one_rank, photo_jpeg, photo_records, same_batches  # noqa: F401 (one_rank: a fixture)
from .test_agent import Agents

N, B, SIZE, SHORT = 120, 8, 32, 48


pytestmark = pytest.mark.usefixtures("one_rank")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_records(tmp_path_factory.mktemp("held") / "ds", N, 5, (50, 130), (3, 7), 20_000)


def dataset(url: str, **kw: object) -> stoker.RecordDataset:
    kw.setdefault("batch_size", B)
    kw.setdefault("image_size", SIZE)
    return stoker.RecordDataset(url, seed=11, **kw)  # type: ignore[arg-type]


def epochs(ds: stoker.RecordDataset, n: int, nw: int = 0) -> list[list[dict[str, torch.Tensor]]]:
    loader = stoker.TokenLoader(ds, nw)
    return [list(loader) for _ in range(n)]


same = same_batches


def block_requests(origin) -> Counter[tuple[str, str | None]]:
    return Counter((r.path, r.range) for r in origin.access_log() if "/data/" in r.path)


def test_images_are_decoded_once_per_node_and_not_again_next_epoch(
    serve_dir, images: Path, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(images)
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    expect = epochs(dataset(url, hold="images", short_side=SHORT), 2)  # no agent
    origin.clear_access_log()
    # two DataLoader-like worker processes of stoker's loader, both through one agent
    got = epochs(dataset(url, agent=client, hold="images", short_side=SHORT), 2, nw=2)
    assert same(got[0], expect[0]) and same(got[1], expect[1]), "the agent's pixels differ"
    assert not same(got[0], got[1])  # (the epochs' crops differ: the comparison can fail)
    stats = agents.stats(cache)
    assert stats["images_decoded"] == N  # once for both workers and both epochs
    assert stats["image_errors"] == 0
    blocks = stoker.RecordSource(str(images)).num_blocks
    assert stats["memory_blocks"] == blocks
    requests = block_requests(origin)
    assert len(requests) == blocks and set(requests.values()) == {1}
    assert stats["pinned_blocks"] == 0
    # every worker released what it held (not merely dropped when its connection closed)
    assert stats["pins_released_on_disconnect"] == 0


def test_blocks_are_fetched_once_per_node_and_decoded_by_each_reader(
    serve_dir, images: Path, tmp_path: Path, agents: Agents
) -> None:
    origin, url = serve_dir(images)
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    expect = epochs(dataset(url), 1)[0]
    origin.clear_access_log()
    got = epochs(dataset(url, agent=client), 1, nw=2)[0]
    assert same(got, expect)
    stats = agents.stats(cache)
    assert stats["images_decoded"] == 0  # held as stored: each reader decodes
    blocks = stoker.RecordSource(str(images)).num_blocks
    assert stats["memory_blocks"] == blocks
    assert set(block_requests(origin).values()) == {1}
    assert len(block_requests(origin)) == blocks
    held = sorted(Path(stoker.cache.paths.AgentPaths(cache).shm).glob("*.arrow"))
    assert len(held) == blocks


def test_a_dataset_started_agent_holds_the_images(
    images: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.dirs.append(cache)  # (killed at the end: the reader starts it)
    config = stoker.AgentConfig(str(cache), metrics_port=None)
    ds = dataset(str(images), cache=config, hold="images")
    assert ds.agent is not None and ds.agent.config == config
    agents.own(ds.agent)
    got = epochs(ds, 2)
    expect = epochs(dataset(str(images), hold="images"), 2)
    assert same(got[0], expect[0]) and same(got[1], expect[1])
    assert agents.stats(cache)["images_decoded"] == N  # (full size: no short side)


def test_without_room_the_reader_decodes_the_same_pixels(
    images: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache, "--shm-limit", "64")  # smaller than any block's images
    client = agents.client(cache)
    with pytest.warns(UserWarning, match="no room in shared memory"):
        got = epochs(dataset(str(images), agent=client, hold="images", short_side=SHORT), 1)
    assert same(got[0], epochs(dataset(str(images), hold="images", short_side=SHORT), 1)[0])
    stats = client.stats()
    assert stats["memory_blocks"] == 0 and stats["inline_fallbacks"] > 0


def test_a_bad_image_held_by_the_agent_is_named(
    images: Path, tmp_path: Path, agents: Agents
) -> None:
    rng = np.random.default_rng(2)
    rows = [{"image": photo_jpeg(rng, 40, 40), "label": 1} for _ in range(30)]
    rows[17]["image"] = rows[17]["image"][: len(rows[17]["image"]) // 2]  # truncated
    rows[4]["image"] = b"this is not an image"
    bad = tmp_path / "bad"
    stoker.write_records(rows, str(bad), schema={"image": "binary", "label": "int64"},
                         block_bytes=5_000)  # fmt: skip
    src = stoker.RecordSource(str(bad))
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    for hold in ("images", "blocks"):
        with pytest.raises(stoker.DatasetError) as info:
            epochs(dataset(str(bad), agent=client, hold=hold, shuffle=False), 1)
        block = int(src.block_of(np.array([4]))[0])
        text = str(info.value)
        assert f"row 4 (block {block})" in text and "not an image" in text
        assert src.manifest.block_file(block).path in text
    # the agent kept the row's error, not failed the block: the rest of it decoded
    assert client.stats()["image_errors"] >= 1
    assert client.stats()["images_decoded"] >= int(src.index["rows"][block]) - 1


def test_an_agents_file_that_lies_about_its_pixels_is_refused(images: Path, tmp_path: Path) -> None:
    from stoker.records.held import View, prepare_block, read_held, write_batch

    src = stoker.RecordSource(str(images))
    view = View(hold="images", short_side=SHORT, columns=("label",))
    held, decoded = prepare_block(src.block(0), view)
    rows = int(src.index["rows"][0])
    assert decoded == rows
    import pyarrow as pa

    cols = held.columns
    forged = pa.RecordBatch.from_arrays(
        [cols[0], pa.array(np.asarray(cols[1]) + 1, pa.int32()), *cols[2:]], schema=held.schema
    )
    path = tmp_path / "forged.arrow"
    write_batch(path, forged)
    with pytest.raises(stoker.DatasetError, match="do not match their sizes"):
        read_held(pa.py_buffer(path.read_bytes()), rows, held.schema, "block 0")
    write_batch(path, held)
    with pytest.raises(stoker.DatasetError, match="does not hold"):
        read_held(pa.py_buffer(path.read_bytes()), rows + 1, held.schema, "block 0")
    got = read_held(pa.py_buffer(path.read_bytes()), rows, held.schema, "block 0")
    assert got.num_rows == rows


def test_the_node_reports_the_windows_it_holds_and_a_coordinator_reads_through_it(
    images: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    ds = dataset(str(images), agent=client, hold="images", short_side=SHORT)
    local = ds.locality()["local"]
    assert local(0) == []  # a fresh agent holds nothing
    holds = ds.holds()
    assert holds is not None and not holds(np.arange(N)).any()
    loader = stoker.TokenLoader(ds, 2, coordinator="rank0")  # leases, locality on
    try:
        got = [i for b in loader for i in b["sample_id"].tolist()]
    finally:
        loader.close()
    assert sorted(got) == list(range(N))
    assert client.stats()["images_decoded"] == N
    # every block held: every window of any epoch is local to this node
    assert local(1) == [(N, 2 * N)]
    holds = ds.holds()  # (what the agent holds now: every row's block)
    assert holds is not None and holds(np.arange(N)).all()
    blocks = stoker.RecordSource(str(images)).num_blocks
    assert (
        ds.agent is not None
        and len(ds.agent.holdings(ds.view().key(ds.source.manifest.dataset_id))) == blocks
    )


def test_a_records_dataset_opened_as_tokens_is_refused(
    images: Path, tmp_path: Path, agents: Agents
) -> None:
    cache = tmp_path / "cache"
    agents.start(cache)
    client = agents.client(cache)
    src = stoker.RecordSource(str(images))
    key = client.open(str(images), None, src.manifest.dataset_id, View())
    assert key == src.manifest.dataset_id  # (its blocks as stored: the dataset's own name)
    with pytest.raises(stoker.DatasetError, match="open on this agent as a records dataset"):
        client.open(str(images), None, src.manifest.dataset_id)  # a token reader's Open

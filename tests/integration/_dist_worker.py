"""One rank of a real multi-process run, started by test_distributed.py.

Usage: python _dist_worker.py OUT_JSON DATASET_URL SEQ_LEN EPOCHS [INIT_METHOD RANK WORLD]

With INIT_METHOD, joins a gloo process group (rank and world given to
torch.distributed only); without it, relies on RANK / WORLD_SIZE in the
environment. Either way the TokenDataset is built without rank/world_size.
Writes the sample ids of each epoch (and, in a process group, every rank's
ids gathered on this rank) to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    out, url, seq_len, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    init = sys.argv[5] if len(sys.argv) > 5 else None

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from stoker import TokenDataset

    if init is not None:
        rank, world = int(sys.argv[6]), int(sys.argv[7])
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)

    ds = TokenDataset(url, seq_len, batch_size=4, shard_size=4, window_shards=2, seed=5)
    result: dict[str, object] = {
        "pid": os.getpid(),
        "num_samples": ds.num_samples,
        "env_rank": os.environ.get("RANK"),
        "epochs": [],
        "tokens_ok": True,
    }
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        ids: list[int] = []
        loader = DataLoader(ds, batch_size=4, num_workers=1, timeout=120)
        for batch in loader:
            ids.extend(batch["sample_id"].tolist())
            # spot check the tokens against an independent read
            sid = int(batch["sample_id"][0])
            want = ds.source.tokens(sid * seq_len, sid * seq_len + seq_len + 1)
            if batch["tokens"][0].tolist() != want.tolist():
                result["tokens_ok"] = False
        entry: dict[str, object] = {"ids": ids, "len": len(loader)}
        if init is not None:
            gathered: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, ids)
            entry["gathered"] = gathered
        result["epochs"].append(entry)  # type: ignore[union-attr]
    if init is not None:
        dist.barrier()
        dist.destroy_process_group()
    with open(out + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()

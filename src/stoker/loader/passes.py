"""Which epoch a torch DataLoader's workers run when the loader is iterated again.

A ``TokenDataset`` iterated in its own process counts what it handed out, so
iterating it again continues the epoch. Through torch ``DataLoader`` worker
processes it cannot: every iteration forks fresh copies of the dataset from the
main process, which never sees what they read. Left alone, each iteration would
run the same epoch again from its start and deliver its samples twice.

So the workers leave a mark: ``<shm>/stoker-passes-<parent pid>/<dataset>-<epoch>``
holds the *pass* (one DataLoader iteration: its workers share the base seed torch
draws for it) that ran that epoch. A worker of a later pass that finds the epoch
taken by another pass runs the first epoch no pass has taken instead, with one
warning: iterating again starts the next epoch, as it does after an epoch's end,
and the rest of a broken-off epoch is skipped, never read twice. ``set_epoch`` and
``load_state_dict`` in the main process give the dataset a fresh ``<dataset>`` key,
so what they ask for is run as asked. Directories of parents that are gone are
removed by the next worker that marks an epoch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from stoker.runtime import alive

PREFIX = "stoker-passes-"


def _base() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _sweep(base: str, keep: str) -> None:
    """Remove the directories of parents that no longer exist."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.startswith(PREFIX) or name == keep:
                continue
            pid = name[len(PREFIX) :]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def claim(parent: int, key: str, epoch: int, pass_id: int) -> int:
    """The epoch that pass ``pass_id`` of dataset ``key`` runs: ``epoch``, or the first
    one after it that no other pass of this parent's has run."""
    base = _base()
    name = f"{PREFIX}{parent}"
    root = os.path.join(base, name)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        return epoch  # nowhere to mark: behave as torch does
    _sweep(base, name)
    mine = str(pass_id).encode()
    while True:
        path = os.path.join(root, f"{key}-{epoch}")
        # written aside and linked into place: a mark is never seen half written
        tmp = os.path.join(root, f".{key}-{epoch}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(mine)
            try:
                os.link(tmp, path)
                return epoch
            except FileExistsError:
                with open(path, "rb") as fh:
                    owner = fh.read()
            finally:
                os.unlink(tmp)
        except OSError:
            return epoch  # nowhere to mark: behave as torch does
        if owner == mine:
            return epoch
        epoch += 1

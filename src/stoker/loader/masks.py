"""Document boundaries of packed samples, for block-diagonal attention."""

from __future__ import annotations

import torch


def doc_starts(mask: torch.Tensor) -> torch.Tensor:
    """Offsets of document starts inside one sample (from its ``doc_start_mask``)."""
    if mask.dim() != 1:
        raise ValueError(f"doc_starts takes one sample's mask (1-D), got shape {tuple(mask.shape)}")
    return torch.nonzero(mask, as_tuple=False).reshape(-1)


def cu_seqlens(mask: torch.Tensor) -> torch.Tensor:
    """Cumulative segment lengths (int32) for varlen attention over a batch.

    ``mask`` is ``(batch, n)``: each row a sample's ``doc_start_mask`` over the
    ``n`` positions fed to the model (usually ``tokens[:, :-1]``, so pass
    ``mask[:, :-1]``). Every row starts a segment at 0, and a new segment
    begins at every document start; the result indexes the flattened batch,
    as FlashAttention's ``cu_seqlens`` expects.
    """
    if mask.dim() != 2:
        raise ValueError(f"cu_seqlens takes a (batch, n) mask, got shape {tuple(mask.shape)}")
    b, n = mask.shape
    starts = mask.clone()
    starts[:, 0] = True
    flat = torch.nonzero(starts.reshape(-1), as_tuple=False).reshape(-1)
    return torch.cat([flat, torch.tensor([b * n], device=flat.device)]).to(torch.int32)

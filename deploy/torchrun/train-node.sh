#!/bin/bash
# One node of a stoker training job under torchrun: run it on every node of the job,
# each with the same variables. torchrun's c10d rendezvous gathers the nodes; rank 0
# starts the job's coordinator and the other ranks find it (address and a fresh token)
# in torchrun's store; each node's ranks read through that node's agent, which the first
# of them starts on CACHE_DIR.
#
#   NNODES=4 RDZV_ENDPOINT=node-0:29400 DATASET=s3://bucket/tokens \
#     CACHE_DIR=/mnt/nvme/stoker CHECKPOINT=/shared/run1 bash deploy/torchrun/train-node.sh
#
# Variables:
#   NNODES           nodes in the job (required)
#   RDZV_ENDPOINT    HOST:PORT of the rendezvous, on a node all reach (required; the
#                    port, 29400 by custom, must be open between the nodes)
#   DATASET          the token dataset's URL (required)
#   NPROC_PER_NODE   ranks a node (default: one a GPU, "gpu"; on CPU nodes give a number)
#   RDZV_ID          the job's id, the same on every node (default: stoker)
#   CACHE_DIR        the node agent's directory, local NVMe (default: no agent)
#   CHECKPOINT       a directory every node reaches: saved to, and resumed from when it
#                    holds a checkpoint, on any number of nodes (default: none)
#   LOCAL_ADDR       this node's address as the others reach it (default: what its host
#                    name resolves to; give it on nodes with several networks)
#   RDZV_CONF        torchrun's --rdzv-conf: on the node at RDZV_ENDPOINT, is_host=1 when
#                    that address is not its host name's (a second network)
# Ports: the rendezvous (RDZV_ENDPOINT), torch.distributed's own (MASTER_PORT, which
# torchrun picks), and the coordinator's on rank 0's node (any free port, or
# STOKER_COORDINATOR_BIND=HOST:PORT to fix it for a firewall). Token: the coordinator's
# is drawn by rank 0 and handed to the ranks through the store; to use a running
# coordinator instead set STOKER_COORDINATOR=HOST:PORT and STOKER_COORDINATOR_TOKEN.
# Arguments after the variables go to the training job (python -m stoker.train --help).
set -euo pipefail

: "${NNODES:?set NNODES to the number of nodes}"
: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT to host:port of the rendezvous}"
: "${DATASET:?set DATASET to the token dataset URL}"

args=(--dataset "$DATASET")
if [ -n "${CACHE_DIR:-}" ]; then args+=(--cache-dir "$CACHE_DIR"); fi
if [ -n "${CHECKPOINT:-}" ]; then args+=(--checkpoint "$CHECKPOINT"); fi

opts=()
if [ -n "${LOCAL_ADDR:-}" ]; then opts+=(--local-addr "$LOCAL_ADDR"); fi
if [ -n "${RDZV_CONF:-}" ]; then opts+=(--rdzv-conf "$RDZV_CONF"); fi

exec torchrun \
  ${opts[@]+"${opts[@]}"} \
  --nnodes "$NNODES" \
  --nproc-per-node "${NPROC_PER_NODE:-gpu}" \
  --rdzv-backend c10d \
  --rdzv-endpoint "$RDZV_ENDPOINT" \
  --rdzv-id "${RDZV_ID:-stoker}" \
  -m stoker.train "${args[@]}" "$@"

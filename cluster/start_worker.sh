#!/usr/bin/env bash
# Join a worker to the farm cluster; pool replicas are placed on workers.
set -euo pipefail
: "${RAY_HEAD_IP:?set RAY_HEAD_IP to the cluster address of the head}"
exec ray start --address "$RAY_HEAD_IP:${RAY_PORT:-6379}" --num-cpus "${RAY_NUM_CPUS:-$(nproc)}" \
  --disable-usage-stats

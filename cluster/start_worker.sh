#!/usr/bin/env bash
# Join a worker to the farm cluster; pool replicas are placed on workers.
set -euo pipefail
# Serve's HAProxy ingress (ENVFARM_PROXY=python: Serve's Python proxy); every node must agree.
if [ "${ENVFARM_PROXY:-haproxy}" = haproxy ]; then on=1; else on=0; fi
export RAY_SERVE_ENABLE_HA_PROXY=$on RAY_SERVE_THROUGHPUT_OPTIMIZED=$on
: "${RAY_HEAD_IP:?set RAY_HEAD_IP to the cluster address of the head}"
exec ray start --address "$RAY_HEAD_IP:${RAY_PORT:-6379}" --num-cpus "${RAY_NUM_CPUS:-$(nproc)}" \
  --disable-usage-stats

#!/usr/bin/env bash
# Start the Ray head of a farm cluster. The head runs the Serve controller and ingress only.
set -euo pipefail
# Serve's HAProxy ingress (ENVFARM_PROXY=python: Serve's Python proxy); every node must agree.
if [ "${ENVFARM_PROXY:-haproxy}" = haproxy ]; then on=1; else on=0; fi
export RAY_SERVE_ENABLE_HA_PROXY=$on RAY_SERVE_THROUGHPUT_OPTIMIZED=$on
: "${RAY_HEAD_IP:?set RAY_HEAD_IP to the cluster address of this machine}"
exec ray start --head --node-ip-address "$RAY_HEAD_IP" --port "${RAY_PORT:-6379}" \
  --num-cpus 0 --include-dashboard "${RAY_DASHBOARD:-false}" --disable-usage-stats

#!/usr/bin/env bash
# Start the Ray head of a farm cluster. The head runs the Serve controller and proxy only.
set -euo pipefail
: "${RAY_HEAD_IP:?set RAY_HEAD_IP to the cluster address of this machine}"
exec ray start --head --node-ip-address "$RAY_HEAD_IP" --port "${RAY_PORT:-6379}" \
  --num-cpus 0 --include-dashboard "${RAY_DASHBOARD:-false}" --disable-usage-stats

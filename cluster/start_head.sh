#!/usr/bin/env bash
# Start the Ray head of a farm cluster. The head runs the Serve controller and ingress only.
set -euo pipefail
# Serve's HAProxy ingress (ENVFARM_PROXY=python: Serve's Python proxy); every node must agree.
if [ "${ENVFARM_PROXY:-haproxy}" = haproxy ]; then on=1; else on=0; fi
export RAY_SERVE_ENABLE_HA_PROXY=$on RAY_SERVE_THROUGHPUT_OPTIMIZED=$on
# The farm's tuning (why: cluster/serve/_ingress.py, HAPROXY_TUNING and RAY_TUNING).
export RAY_SERVE_HAPROXY_HEALTH_CHECK_DOWNINTER="${RAY_SERVE_HAPROXY_HEALTH_CHECK_DOWNINTER:-250ms maxconn 64}"
export RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S="${RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S:-30}"
export RAY_SERVE_HAPROXY_METRICS_ENABLED="${RAY_SERVE_HAPROXY_METRICS_ENABLED:-0}"
export RAY_task_events_report_interval_ms="${RAY_task_events_report_interval_ms:-0}"
: "${RAY_HEAD_IP:?set RAY_HEAD_IP to the cluster address of this machine}"
exec ray start --head --node-ip-address "$RAY_HEAD_IP" --port "${RAY_PORT:-6379}" \
  --num-cpus 0 --include-dashboard "${RAY_DASHBOARD:-false}" --disable-usage-stats

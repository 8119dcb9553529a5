#!/bin/sh
# Container entry point of the project image. With RAY_HEAD_ADDRESS set, this container first joins
# the Ray head as a worker node (one Ray node per container: the same path as a multi-node
# cluster), then runs the service command; without it, it just runs the command.
set -e
# Ray gives a starting node a fixed 30 s to register with the GCS; on a starved machine that can
# fail, so joining is retried (the container's restart policy is the outer retry).
if [ -n "${RAY_HEAD_ADDRESS:-}" ]; then
  tries=${RAY_JOIN_TRIES:-5}
  until ray start --address="$RAY_HEAD_ADDRESS" --num-cpus="${RAY_NODE_CPUS:-1}" \
      --object-store-memory="${RAY_OBJECT_STORE_BYTES:-100000000}" --disable-usage-stats \
      >/tmp/ray-start.log 2>&1; do
    tail -3 /tmp/ray-start.log >&2
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || exit 1
    ray stop --force >/dev/null 2>&1 || true
    sleep 5
  done
fi
exec "$@"

#!/bin/sh
# Container entry point of the project image. With RAY_HEAD_ADDRESS set, this container first joins
# the Ray head as a worker node (one Ray node per container: the same path as a multi-node
# cluster), then runs the service command; without it, it just runs the command.
set -e
if [ -n "${RAY_HEAD_ADDRESS:-}" ]; then
  if ! ray start --address="$RAY_HEAD_ADDRESS" --num-cpus="${RAY_NODE_CPUS:-1}" \
      --object-store-memory="${RAY_OBJECT_STORE_BYTES:-100000000}" --disable-usage-stats \
      >/tmp/ray-start.log 2>&1; then
    cat /tmp/ray-start.log >&2
    exit 1
  fi
fi
exec "$@"

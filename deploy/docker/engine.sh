#!/usr/bin/env bash
# Run a private Docker engine that changes nothing on the host: its own data root, exec root,
# pidfile and unix socket under $DOCKER_STATE, inside its own network namespace (unshare -n), with
# iptables and the default bridge off. Stopped by PID. Usage: engine.sh start|stop|purge|renice N|exec CMD...
#   export DOCKER_HOST=unix://$DOCKER_STATE/docker.sock   # then docker / docker-compose use it
#   engine.sh exec curl http://127.0.0.1:8000/health      # reach published ports (inside the netns)
set -euo pipefail
DOCKER_STATE=${DOCKER_STATE:-/tmp/rackserve-docker}
SOCK=$DOCKER_STATE/docker.sock
PIDFILE=$DOCKER_STATE/unshare.pid

start() {
  mkdir -p "$DOCKER_STATE"
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "engine already running (pid $(cat "$PIDFILE"))" >&2; return
  fi
  # The netns lives as long as the unshare'd shell; dockerd starts its own containerd inside it.
  # nice 19: the engine and every container it starts yield the shared cores to everything else.
  nice -n 19 unshare --net --fork sh -c "ip link set lo up; exec dockerd \
      --data-root $DOCKER_STATE/data --exec-root $DOCKER_STATE/exec \
      --pidfile $DOCKER_STATE/dockerd.pid -H unix://$SOCK \
      --iptables=false --ip-masq=false --bridge=none --storage-driver=overlay2" \
    >"$DOCKER_STATE/dockerd.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 100); do
    if DOCKER_HOST=unix://$SOCK docker version >/dev/null 2>&1; then
      echo "engine up: export DOCKER_HOST=unix://$SOCK" >&2; return
    fi
    sleep 0.3
  done
  echo "engine did not answer; see $DOCKER_STATE/dockerd.log" >&2; exit 1
}

stop() {
  [ -f "$DOCKER_STATE/dockerd.pid" ] || { echo "no engine pidfile" >&2; return; }
  local pid; pid=$(cat "$DOCKER_STATE/dockerd.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$PIDFILE"
  # dockerd normally unmounts what it mounted under its roots; drop any leftovers (ours only).
  awk -v root="$DOCKER_STATE/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount
}

purge() {  # stop, then delete the engine's state (images, volumes, logs)
  stop
  rm -rf "$DOCKER_STATE"
}

renice_engine() {  # containers inherit the niceness of containerd at their start
  local pid; pid=$(cat "$DOCKER_STATE/dockerd.pid")
  renice -n "$1" -p "$pid" $(pgrep -P "$pid") >/dev/null
}

netns_exec() {
  nsenter --target "$(cat "$DOCKER_STATE/dockerd.pid")" --net -- "$@"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  purge) purge ;;
  renice) renice_engine "$2" ;;
  exec) shift; netns_exec "$@" ;;
  *) echo "usage: $0 start|stop|purge|renice N|exec CMD..." >&2; exit 2 ;;
esac

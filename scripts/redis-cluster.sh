#!/usr/bin/env bash
# A local Redis Cluster of three masters on loopback, for the shared tier's
# tests and `kvcm bench shared`.
#
#   scripts/redis-cluster.sh start        install redis-server with apt where
#                                         it is missing (as root), start three
#                                         masters on 127.0.0.1, create the
#                                         cluster and wait for cluster_state:ok;
#                                         prints the seed addresses
#   scripts/redis-cluster.sh install      install redis-server with apt where
#                                         it is missing (as root), only
#   scripts/redis-cluster.sh stop         stop every node and remove the data
#   scripts/redis-cluster.sh status       the cluster's state and its nodes
#   scripts/redis-cluster.sh addrs        the seed addresses, comma-separated
#   scripts/redis-cluster.sh stop-node N  stop master N (0, 1 or 2) without
#                                         saving, as a crash would
#   scripts/redis-cluster.sh start-node N start master N again and wait for
#                                         cluster_state:ok
#
# Environment: KVCM_REDIS_BASE_PORT (7101: nodes on 7101-7103, cluster bus on
# 17101-17103), KVCM_REDIS_DIR (the data directory, default
# ${TMPDIR:-/tmp}/kvcm-redis-cluster-$BASE_PORT), KVCM_REDIS_MAXMEMORY (per
# node, 256mb), KVCM_REDIS_POLICY (allkeys-lru: a full cluster evicts, which
# the shared tier sees as misses), KVCM_REDIS_BIN (a directory holding
# redis-server and redis-cli commands to use instead of the installed ones,
# nothing installed then: the bin/ of scripts/redis-pack.sh's tarball). Only
# 127.0.0.1 is ever bound or addressed.
set -euo pipefail

BASE_PORT=${KVCM_REDIS_BASE_PORT:-7101}
DIR=${KVCM_REDIS_DIR:-${TMPDIR:-/tmp}/kvcm-redis-cluster-$BASE_PORT}
MAXMEMORY=${KVCM_REDIS_MAXMEMORY:-256mb}
POLICY=${KVCM_REDIS_POLICY:-allkeys-lru}
REDIS_BIN=${KVCM_REDIS_BIN:-}
REDIS_SERVER=redis-server
REDIS_CLI=redis-cli
if [ -n "$REDIS_BIN" ]; then
	REDIS_SERVER=$REDIS_BIN/redis-server
	REDIS_CLI=$REDIS_BIN/redis-cli
fi
HOST=127.0.0.1
NODES=3
WAIT_TRIES=100 # 0.1 s each: 10 s at most for any wait

ports() { for ((i = 0; i < NODES; i++)); do echo $((BASE_PORT + i)); done; }

addrs() {
	local out=() p
	for p in $(ports); do out+=("$HOST:$p"); done
	(IFS=,; echo "${out[*]}")
}

install_redis() {
	if command -v "$REDIS_SERVER" >/dev/null && command -v "$REDIS_CLI" >/dev/null; then
		return
	fi
	if [ -n "$REDIS_BIN" ]; then
		echo "redis-cluster: KVCM_REDIS_BIN=$REDIS_BIN has no redis-server and redis-cli" >&2
		exit 1
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "redis-cluster: redis-server is missing and installing it needs root" >&2
		exit 1
	fi
	echo "redis-cluster: installing redis-server with apt" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends redis-server >&2
	# The package starts a system instance on 6379; the cluster does not use it.
	if command -v service >/dev/null; then service redis-server stop >/dev/null 2>&1 || true; fi
}

cli() { timeout 5 "$REDIS_CLI" -h "$HOST" -p "$1" "${@:2}"; }

wait_ping() {
	local p=$1 i
	for ((i = 0; i < WAIT_TRIES; i++)); do
		if [ "$(cli "$p" ping 2>/dev/null)" = PONG ]; then return 0; fi
		sleep 0.1
	done
	echo "redis-cluster: node $HOST:$p did not answer" >&2
	return 1
}

wait_ok() {
	local i p ok
	for ((i = 0; i < WAIT_TRIES * 3; i++)); do
		ok=1
		for p in $(ports); do
			if ! cli "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then ok=0; break; fi
		done
		if [ $ok = 1 ]; then return 0; fi
		sleep 0.1
	done
	echo "redis-cluster: cluster_state did not become ok" >&2
	return 1
}

start_node() {
	local p=$1
	mkdir -p "$DIR/$p"
	"$REDIS_SERVER" --bind "$HOST" --port "$p" --protected-mode yes \
		--cluster-enabled yes --cluster-config-file "$DIR/$p/nodes.conf" \
		--cluster-node-timeout 2000 --cluster-require-full-coverage no \
		--dir "$DIR/$p" --save '' --appendonly no \
		--maxmemory "$MAXMEMORY" --maxmemory-policy "$POLICY" \
		--daemonize yes --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log"
	wait_ping "$p"
}

start() {
	install_redis
	local p
	if [ -f "$DIR/created" ] && cli "$BASE_PORT" ping >/dev/null 2>&1; then
		wait_ok
		addrs
		return
	fi
	stop >/dev/null 2>&1 || true
	mkdir -p "$DIR"
	for p in $(ports); do start_node "$p"; done
	local seeds=()
	for p in $(ports); do seeds+=("$HOST:$p"); done
	timeout 30 "$REDIS_CLI" --cluster create "${seeds[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 ||
		{ cat "$DIR/create.log" >&2; exit 1; }
	touch "$DIR/created"
	wait_ok
	addrs
}

stop_port() {
	local p=$1 pid i
	[ -f "$DIR/$p/redis.pid" ] || return 0
	pid=$(cat "$DIR/$p/redis.pid")
	cli "$p" shutdown nosave >/dev/null 2>&1 || true
	for ((i = 0; i < WAIT_TRIES; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
	rm -f "$DIR/$p/redis.pid"
}

stop() {
	local p
	for p in $(ports); do stop_port "$p"; done
	case "$DIR" in
	*kvcm-redis-cluster*) rm -rf "$DIR" ;;
	esac
}

node_port() {
	local n=$1
	if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n >= NODES)); then
		echo "redis-cluster: node must be 0..$((NODES - 1)), got '$n'" >&2
		exit 2
	fi
	echo $((BASE_PORT + n))
}

status() {
	cli "$BASE_PORT" cluster info | grep -E '^cluster_(state|slots_assigned|known_nodes)'
	cli "$BASE_PORT" cluster nodes
}

case "${1:-}" in
install) install_redis ;;
start) start ;;
stop) stop ;;
status) status ;;
addrs) addrs ;;
stop-node) stop_port "$(node_port "${2:-}")" ;;
start-node)
	p=$(node_port "${2:-}")
	start_node "$p"
	wait_ok
	;;
*)
	sed -n '2,27p' "$0" >&2
	exit 2
	;;
esac

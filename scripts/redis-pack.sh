#!/usr/bin/env bash
# redis-server and redis-cli packed to run on a Linux machine without them
# (the GPU machine: no Redis, no network), and `kvcm bench shared` run there
# against a local cluster started from the pack.
#
#   scripts/redis-pack.sh pack [TARBALL]
#       on a machine with redis-server (installed with apt where missing, as
#       scripts/redis-cluster.sh does): pack redis-server and redis-cli, every
#       shared library they load, the dynamic loader and
#       scripts/redis-cluster.sh into TARBALL (default
#       build/redis-pack.tar.gz). bin/redis-server and bin/redis-cli in it run
#       the binaries with the packed loader (ld-linux-x86-64.so.2
#       --library-path lib), so they need nothing of the machine's libraries.
#   scripts/redis-pack.sh bench-shared TARBALL KVCM [ARGS...]
#       unpack TARBALL into a temporary directory, start the three-master
#       cluster from it on 127.0.0.1 (ports KVCM_REDIS_BASE_PORT.., default
#       7101), run `KVCM bench shared -addrs <the cluster> ARGS...`, then stop
#       the cluster and remove the directory (also on failure or interrupt).
#       Exit status: the benchmark's.
#   scripts/redis-pack.sh check [TARBALL]
#       unpack TARBALL into a temporary directory, start the cluster from it,
#       SET and GET a key through the cluster, stop it: the pack works here.
#
# Environment (bench-shared, check): KVCM_REDIS_BASE_PORT,
# KVCM_REDIS_MAXMEMORY and KVCM_REDIS_POLICY as for scripts/redis-cluster.sh
# (its data directory is inside the temporary one). x86-64 Linux only.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
loader=ld-linux-x86-64.so.2

pack() {
	local out=${1:-$root/build/redis-pack.tar.gz}
	case $out in /*) ;; *) out=$PWD/$out ;; esac
	if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
		KVCM_REDIS_BIN='' bash "$root/scripts/redis-cluster.sh" install
	fi
	local tmp
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	local d=$tmp/kvcm-redis
	mkdir -p "$d/bin" "$d/libexec" "$d/lib"
	# redis-server may be a link to redis-check-rdb: Redis picks its mode
	# from argv[0], so the binary is copied under the server's name.
	local server cli
	server=$(readlink -f "$(command -v redis-server)")
	cli=$(readlink -f "$(command -v redis-cli)")
	cp "$server" "$d/libexec/redis-server"
	cp "$cli" "$d/libexec/redis-cli"
	local lib
	for lib in $(ldd "$server" "$cli" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
		cp -L "$lib" "$d/lib/$(basename "$lib")"
	done
	if [ ! -f "$d/lib/$loader" ]; then
		echo "redis-pack: no $loader among the libraries of $server (not x86-64 glibc?)" >&2
		return 1
	fi
	chmod +x "$d/lib/$loader"
	local name
	for name in redis-server redis-cli; do
		cat >"$d/bin/$name" <<EOF
#!/bin/sh
# $name with the packed loader and libraries (scripts/redis-pack.sh).
d=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$d/lib/$loader" --library-path "\$d/lib" "\$d/libexec/$name" "\$@"
EOF
		chmod +x "$d/bin/$name"
	done
	cp "$root/scripts/redis-cluster.sh" "$d/redis-cluster.sh"
	redis-server --version >"$d/VERSION"
	mkdir -p "$(dirname "$out")"
	tar czf "$out" -C "$tmp" kvcm-redis
	echo "packed $(cut -d' ' -f1-3 "$d/VERSION") into $out ($(du -h "$out" | cut -f1))"
}

# with_cluster TARBALL CMD...: CMD with the pack's cluster running, its seed
# addresses in $addrs; the cluster and the directory go afterwards.
with_cluster() {
	local tarball=$1
	shift
	case $tarball in /*) ;; *) tarball=$PWD/$tarball ;; esac
	[ -f "$tarball" ] || { echo "redis-pack: no tarball $tarball (scripts/redis-pack.sh pack)" >&2; return 2; }
	local tmp
	tmp=$(mktemp -d)
	tar xzf "$tarball" -C "$tmp"
	export KVCM_REDIS_BIN=$tmp/kvcm-redis/bin KVCM_REDIS_DIR=$tmp/kvcm-redis-cluster-data
	local cluster=$tmp/kvcm-redis/redis-cluster.sh
	stop_cluster() {
		bash "$cluster" stop >/dev/null 2>&1 || true
		rm -rf "$tmp"
	}
	trap stop_cluster EXIT INT TERM
	addrs=$(bash "$cluster" start)
	echo "redis-pack: cluster $addrs from $(cut -d' ' -f1-3 "$tmp/kvcm-redis/VERSION")" >&2
	local rc=0
	"$@" || rc=$?
	stop_cluster
	trap - EXIT INT TERM
	return $rc
}

check_cluster() {
	local cli=$KVCM_REDIS_BIN/redis-cli port=${addrs%%,*}
	port=${port##*:}
	[ "$("$cli" -c -h 127.0.0.1 -p "$port" set kvcm-pack-check ok)" = OK ]
	[ "$("$cli" -c -h 127.0.0.1 -p "$port" get kvcm-pack-check)" = ok ]
	"$cli" -h 127.0.0.1 -p "$port" cluster info | grep -q '^cluster_state:ok'
	local pid
	pid=$(cat "$KVCM_REDIS_DIR/$port/redis.pid")
	echo "redis-pack: node $port runs $(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -d' ' -f1-4)"
	echo "redis-pack: SET and GET through the cluster work"
}

case "${1:-}" in
pack)
	pack "${2:-}"
	;;
bench-shared)
	[ $# -ge 3 ] || { echo "usage: scripts/redis-pack.sh bench-shared TARBALL KVCM [ARGS...]" >&2; exit 2; }
	tarball=$2 kvcm=$3
	shift 3
	case $kvcm in /*) ;; */*) kvcm=$PWD/$kvcm ;; esac
	bench() { "$kvcm" bench shared -addrs "$addrs" "$@"; }
	with_cluster "$tarball" bench "$@"
	;;
check)
	with_cluster "${2:-$root/build/redis-pack.tar.gz}" check_cluster
	;;
*)
	sed -n '2,26p' "$0" >&2
	exit 2
	;;
esac

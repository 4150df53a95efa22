#!/usr/bin/env bash
# Build Citus from a source snapshot you provide, and run a three-node cluster
# (a coordinator and two workers) on loopback ports, for chatledger's Citus
# tests and bench (docs/scaling.md, "Citus").
#
#   scripts/citus.sh build SRC     configure, make and install Citus from SRC
#                                  (a Citus 13.x source tree, the last line
#                                  for Postgres 15) into this machine's
#                                  Postgres 15
#   scripts/citus.sh start [DIR]   initdb and start the three nodes under DIR
#                                  (default /tmp/chatledger-citus), add the
#                                  workers, print the coordinator's URL
#   scripts/citus.sh stop [DIR]    stop them (the data stays)
#   scripts/citus.sh url [PORT]    the coordinator's URL
#
# Needs Debian's postgresql-15, postgresql-server-dev-15 and the build tools:
#   apt-get install -y postgresql-server-dev-15 build-essential autoconf flex \
#       bison libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev \
#       libssl-dev libicu-dev libselinux1-dev libxslt1-dev libpam0g-dev \
#       libreadline-dev
# Citus's source is never part of chatledger: get it yourself, e.g.
#   git clone --branch v13.2.2 --depth 1 https://github.com/citusdata/citus
# Ports: CITUS_PORT (coordinator, default 9700) and the two after it.
set -euo pipefail

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
PORT="${CITUS_PORT:-9700}"
DB="${CITUS_DB:-chatledger}"

as_postgres() {
    # Postgres refuses to run as root: run its binaries as `postgres` then.
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

build() {
    local src="${1:?usage: citus.sh build SRC}"
    cd "$src"
    # Postgres 15.14 and later declare have_createdb_privilege() themselves;
    # Citus 13's stand-in for older 15s then clashes with it: rename the
    # stand-in (its one caller includes the server's declaration).
    if grep -q 'extern bool have_createdb_privilege' \
        "$("$PG_BIN/pg_config" --includedir-server)/commands/dbcommands.h"; then
        sed -i 's/^have_createdb_privilege(void)$/citus_pg15_have_createdb_privilege(void)/' \
            src/include/pg_version_compat.h
    fi
    ./configure PG_CONFIG="$PG_BIN/pg_config" --without-libcurl >/dev/null
    make -j"$(nproc)" >/dev/null
    make install >/dev/null
    echo "citus installed into $("$PG_BIN/pg_config" --pkglibdir)"
}

url() {
    echo "postgresql+psycopg://postgres@127.0.0.1:${1:-$PORT}/$DB"
}

start() {
    local dir="${1:-/tmp/chatledger-citus}"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    local i port node
    for i in 0 1 2; do
        port=$((PORT + i))
        node="$dir/node$i"
        if [ ! -d "$node" ]; then
            as_postgres "$PG_BIN/initdb" -D "$node" -U postgres -A trust --no-sync >/dev/null
            cat >>"$node/postgresql.conf" <<EOF
shared_preload_libraries = 'citus'
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 300
max_prepared_transactions = 200
fsync = on
citus.shard_count = 32
EOF
        fi
        as_postgres "$PG_BIN/pg_ctl" -D "$node" -l "$dir/node$i.log" -w start >/dev/null
        as_postgres "$PG_BIN/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
            -c "CREATE DATABASE $DB" 2>/dev/null || true
        as_postgres "$PG_BIN/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d "$DB" \
            -c "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
    done
    local sql="$PG_BIN/psql -q -h 127.0.0.1 -p $PORT -U postgres -d $DB -tA"
    as_postgres $sql -c "SELECT citus_set_coordinator_host('127.0.0.1', $PORT)" >/dev/null
    for i in 1 2; do
        as_postgres $sql -c "SELECT citus_add_node('127.0.0.1', $((PORT + i)))" >/dev/null
    done
    as_postgres $sql -c "SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE shouldhaveshards ORDER BY nodeport" \
        | sed 's/^/worker /'
    url
}

stop() {
    local dir="${1:-/tmp/chatledger-citus}" i
    for i in 2 1 0; do
        [ -d "$dir/node$i" ] && as_postgres "$PG_BIN/pg_ctl" -D "$dir/node$i" -m fast -w stop >/dev/null || true
    done
}

case "${1:-}" in
    build) shift; build "$@" ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    url) shift; url "$@" ;;
    *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

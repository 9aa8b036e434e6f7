# shellcheck shell=bash
# Sourced by .ci/run (as root, on Debian): a PostgreSQL server for the database tests, which
# run on it as well as on SQLite. It exports HEXIR_TEST_POSTGRES_URL, the URL of a database
# whose role may create databases (each test creates its own and drops it after).
#
# The server is a throwaway of our own: initdb into a temporary folder as the `postgres` user
# (which the apt package creates; initdb refuses to run as root), listening on 127.0.0.1 only,
# on a free port. So it does not matter whether the package's own cluster exists or runs, nor
# what port it took. An EXIT trap stops the server and deletes its data (the log stays): it
# lives as long as the shell that sourced this file.
#
# By hand, as root: bash -c 'source .ci/postgres.sh && pytest tests/database'

echo "== postgresql: apt-get install -y postgresql"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql >/dev/null

pg_bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort -V | tail -n 1)
pg_dir=$(mktemp -d)
chown postgres: "$pg_dir"
pg_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pg_password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')

pg_as_postgres() {
    # From a folder the postgres user may enter (the checkout may sit under /root).
    (cd "$pg_dir" && runuser -u postgres -- "$@")
}

pg_as_postgres "$pg_bin/initdb" --pgdata="$pg_dir/data" --username=postgres --encoding=UTF8 \
    --no-locale --auth-local=peer --auth-host=scram-sha-256 >/dev/null
# fsync=off: the server is thrown away with the run; a crash of the machine is not a test case.
# autovacuum=off: a test drops its database WITH (FORCE), and an autovacuum worker in it then
# is a backend the test role may not end (InsufficientPrivilege at a test's teardown, once).
if ! pg_as_postgres "$pg_bin/pg_ctl" --pgdata="$pg_dir/data" --log="$pg_dir/server.log" \
    --wait --options="-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_dir -c fsync=off -c autovacuum=off" \
    start >/dev/null; then
    cat "$pg_dir/server.log" >&2
    exit 1
fi
pg_stop() {
    pg_as_postgres "$pg_bin/pg_ctl" --pgdata="$pg_dir/data" --mode=fast stop >/dev/null || true
    rm -rf "$pg_dir/data"
}
trap pg_stop EXIT

pg_as_postgres "$pg_bin/psql" --host="$pg_dir" --port="$pg_port" --quiet -v ON_ERROR_STOP=1 <<EOF
CREATE ROLE hexir LOGIN CREATEDB PASSWORD '$pg_password';
CREATE DATABASE hexir_test OWNER hexir;
EOF

export HEXIR_TEST_POSTGRES_URL="postgresql+psycopg://hexir:$pg_password@127.0.0.1:$pg_port/hexir_test"
echo "== postgresql: $("$pg_bin/postgres" --version) at 127.0.0.1:$pg_port (log: $pg_dir/server.log);" \
    "HEXIR_TEST_POSTGRES_URL=postgresql+psycopg://hexir:***@127.0.0.1:$pg_port/hexir_test"

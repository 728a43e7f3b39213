#!/bin/sh
# The compose stack's passwords, random, written once to .env (next to docker-compose.yml, which
# compose reads for every command): the PostgreSQL superuser's, the `countersign` role's and
# Grafana's admin's. docker-compose.yml gives them no default. An existing .env is kept as it is:
# the database volume was initialised with the passwords it holds.
set -eu
env_file="${1:-.env}"
if [ -e "$env_file" ]; then
    echo "kept $env_file"
    exit 0
fi
secret() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
umask 077
{
    echo "POSTGRES_PASSWORD=$(secret)"
    echo "COUNTERSIGN_DB_PASSWORD=$(secret)"
    echo "GRAFANA_ADMIN_PASSWORD=$(secret)"
} > "$env_file.tmp"
mv "$env_file.tmp" "$env_file"
echo "created $env_file"

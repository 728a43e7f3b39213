#!/bin/sh
# One PostgreSQL instance, separate databases for Temporal (persistence + visibility) and Countersign.
# Run by the postgres image on an empty volume; the role's password is COUNTERSIGN_DB_PASSWORD, the
# one the worker's DATABASE_URL carries (psql quotes it: any character is safe).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v countersign_password="${COUNTERSIGN_DB_PASSWORD:?COUNTERSIGN_DB_PASSWORD is not set}" <<'SQL'
CREATE DATABASE temporal;
CREATE DATABASE temporal_visibility;
CREATE USER countersign WITH PASSWORD :'countersign_password';
CREATE DATABASE countersign OWNER countersign;
SQL

-- One PostgreSQL instance, separate databases for Temporal (persistence + visibility) and Countersign.
CREATE DATABASE temporal;
CREATE DATABASE temporal_visibility;
CREATE USER countersign WITH PASSWORD 'countersign';
CREATE DATABASE countersign OWNER countersign;

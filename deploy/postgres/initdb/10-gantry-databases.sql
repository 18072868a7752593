-- One database per Gantry service, created by the postgres image at its first start (an empty
-- data volume; later starts skip /docker-entrypoint-initdb.d). compose.yaml points each
-- service's GANTRY_<SERVICE>__DATABASE_URL at its own database; tests/deploy/test_compose.py
-- checks that every database named there is created here. The workflows service keeps its
-- Optuna studies in its own database too.
CREATE DATABASE audit OWNER gantry;
CREATE DATABASE governance OWNER gantry;
CREATE DATABASE scheduler OWNER gantry;
CREATE DATABASE serving OWNER gantry;
CREATE DATABASE profiler OWNER gantry;
CREATE DATABASE workflows OWNER gantry;

-- One database per Gantry service, created by the postgres image at its first start (an empty
-- volume; later starts skip /docker-entrypoint-initdb.d). The ConfigMap gantry-platform of this
-- overlay points each service at its own; tests/deploy/test_k8s.py checks that each is created
-- here. The same as deploy/postgres/initdb for compose.
CREATE DATABASE audit OWNER gantry;
CREATE DATABASE governance OWNER gantry;
CREATE DATABASE scheduler OWNER gantry;
CREATE DATABASE serving OWNER gantry;
CREATE DATABASE profiler OWNER gantry;
CREATE DATABASE workflows OWNER gantry;

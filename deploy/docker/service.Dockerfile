# One image per Gantry service, built from the repository root:
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=audit -t gantry-audit .
# Shared libs and the service are installed with the pinned versions in constraints.txt.
FROM python:3.11-slim AS base
ARG SERVICE
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GANTRY_DATA_DIR=/var/lib/gantry
WORKDIR /src
COPY constraints.txt ./
COPY libs/ libs/
COPY services/${SERVICE}/ services/${SERVICE}/
RUN pip install --no-cache-dir -c constraints.txt \
        ./libs/core ./libs/events ./libs/security ./libs/protos ./libs/storage ./libs/sched \
        ./libs/dataload ./libs/client ./libs/training ./services/${SERVICE} \
    && useradd --system --uid 10001 gantry && mkdir -p /var/lib/gantry && chown gantry /var/lib/gantry
USER gantry
ENV SERVICE=${SERVICE}
ENTRYPOINT ["sh", "-c", "exec python -m gantry.${SERVICE} \"$@\"", "--"]

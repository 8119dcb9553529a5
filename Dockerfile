# One image for every rackserve service (router, prefill, decode, kvpool, engram, ray-head); each
# compose service runs it with a different command. Multi-stage: the build stage makes a venv and
# generates the gRPC stubs; the final stage holds only that venv, the source and a non-root user.
#   docker build -t rackserve .                                  # from PyPI, official base
#   docker build --build-arg BASE_IMAGE=rackserve-base:bookworm \
#                --build-arg OFFLINE_WHEELS=1 -t rackserve .      # no registry, no PyPI (deploy/docker)
# Only features of the classic builder are used, so Docker 20.10 without BuildKit builds it.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# The dependency list alone, so that editing pyproject.toml elsewhere keeps the venv layer cached.
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml /tmp/
RUN python3 -c "import tomllib; d = tomllib.load(open('/tmp/pyproject.toml', 'rb')); \
print('\n'.join(sorted(d['project']['dependencies'] + d['build-system']['requires'])))" >/requirements.txt

FROM ${BASE_IMAGE} AS build
# 1 = install only from deploy/docker/wheels (filled by deploy/docker/fetch_wheels.sh).
ARG OFFLINE_WHEELS=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY deploy/docker/wheels/ /wheels/
COPY --from=requirements /requirements.txt /tmp/requirements.txt
# Dependencies first (their own layer: a source edit does not reinstall Ray).
RUN if [ "$OFFLINE_WHEELS" = 1 ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install -q --upgrade pip setuptools wheel \
 && /opt/venv/bin/pip install -q -r /tmp/requirements.txt
COPY pyproject.toml README.md ./
COPY proto/ proto/
COPY rackserve/ rackserve/
COPY services/ services/
COPY scenarios/ scenarios/
COPY bench/ bench/
COPY deploy/docker/ray_node.sh deploy/docker/healthcheck.py deploy/docker/
# Editable install: the `rackserve` CLI, and `python -m services.<name>` resolve to /app; stubs are
# generated here (never copied from the host: .dockerignore drops services/_proto). Bytecode is
# compiled now because the non-root user cannot write it at run time.
RUN if [ "$OFFLINE_WHEELS" = 1 ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels; fi \
 && /opt/venv/bin/pip install -q --no-deps --no-build-isolation -e . \
 && /opt/venv/bin/python -m services.proto_build \
 && /opt/venv/bin/python -m compileall -q rackserve services

FROM ${BASE_IMAGE}
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/rackserve rackserve
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    RAY_USAGE_STATS_ENABLED=0 HOME=/home/rackserve
WORKDIR /app
USER rackserve
EXPOSE 8000
CMD ["rackserve", "--help"]

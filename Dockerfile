# syntax=docker/dockerfile:1
# The vkgate production image: one image for `vkgate controlplane`, `vkgate proxy` and
# `vkgate migrate`. It has no embedded chDB: the spend ledger is a ClickHouse server
# (VKGATE_LEDGER_URL=http(s)://…), the database is Postgres (VKGATE_DATABASE_URL).
#
#   docker build -t registry.example.com/vkgate:0.1.0 .
#   docker run --rm registry.example.com/vkgate:0.1.0 --help

# The version the test suite runs on; every dependency has wheels for it (nothing compiles).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/vkgate
WORKDIR /src
# The hash lock first: its layer is rebuilt only when the lock changes, not with every source.
# Which lock: image.txt (tracing, VKGATE_OTEL_ENDPOINT) by default. Never run.txt or dev.txt in
# production: they bring the embedded chDB, a large native engine the production ledger (a
# ClickHouse server) does not use.
ARG VKGATE_LOCK=image.txt
COPY requirements/${VKGATE_LOCK} ./requirements/
# Only what the lock names, each file checked against its hash (`make lock` refreshes it).
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/vkgate/bin/pip install --require-hashes -r "requirements/${VKGATE_LOCK}"
COPY pyproject.toml README.md ./
COPY vkgate ./vkgate
COPY controlplane ./controlplane
COPY proxy ./proxy
COPY migrations ./migrations
# A regular (not editable) install, built with the lock's setuptools; its dependencies are all
# in place already. pip compiles the bytecode here, because the runtime's root filesystem is
# read-only.
RUN /opt/vkgate/bin/pip install --no-deps --no-build-isolation . \
    && /opt/vkgate/bin/pip check \
    && /opt/vkgate/bin/vkgate --version

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="vkgate" \
      org.opencontainers.image.description="OpenAI-compatible LLM gateway with virtual keys" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# A fixed numeric uid, so Kubernetes can check runAsNonRoot without resolving a user name
# (the Helm chart runs as the same uid).
RUN groupadd --system --gid 10001 vkgate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/vkgate --no-create-home \
       --shell /usr/sbin/nologin vkgate \
    && install --directory --owner 10001 --group 10001 --mode 0750 /var/lib/vkgate /var/spool/vkgate
COPY --from=build /opt/vkgate /opt/vkgate
# Listen on every interface (a container's loopback is its own); the metrics listener too.
# VKGATE_HOME and the spool are the only paths written: mount volumes there when the root
# filesystem is read-only.
ENV PATH=/opt/vkgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VKGATE_HOME=/var/lib/vkgate \
    VKGATE_SPOOL_DIR=/var/spool/vkgate \
    VKGATE_CONTROLPLANE_ADDR=0.0.0.0:5560 \
    VKGATE_PROXY_ADDR=0.0.0.0:5563 \
    VKGATE_METRICS_ADDR=0.0.0.0:9464
WORKDIR /var/lib/vkgate
USER 10001:10001
EXPOSE 5560 5563 9464
# Python as PID 1 is fine here: both servers install their own SIGTERM handlers and drain.
ENTRYPOINT ["vkgate"]
CMD ["proxy"]

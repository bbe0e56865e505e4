# syntax=docker/dockerfile:1
# The pystreams image: `pystreams` as the entrypoint (behind tini), non-root, fine with a
# read-only root file system (only /tmp and the state volume are written).
#
#   docker build -t pystreams:dev .                              # the project
#   docker build --build-arg EXTRAS=spark -t pystreams:spark .    # with optional extras
#
# Add an app with a two-line Dockerfile (see deploy/README.md):
#   FROM pystreams:0.1.0
#   COPY app.py /app/app.py          # and set PYSTREAMS_APP=/app/app.py

ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
# Comma-separated extras of the project to install, e.g. "spark".
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/pystreams
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY pystreams/ pystreams/
COPY assignors/ assignors/
COPY topology/ topology/
COPY state/ state/
# A regular (not editable) install: the source tree stays in this stage.
RUN /opt/pystreams/bin/pip install ".${EXTRAS:+[${EXTRAS}]}" \
    && /opt/pystreams/bin/python -m compileall -q /opt/pystreams

FROM python:${PYTHON_VERSION}-slim-bookworm
# tini as PID 1 forwards SIGTERM to the worker (which then commits and leaves the group) and
# reaps zombies; the Python process is not PID 1, whose default signal handling differs.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 pystreams \
    && useradd --system --uid 10001 --gid pystreams --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin pystreams
COPY --from=build /opt/pystreams /opt/pystreams
COPY examples/ /opt/pystreams/examples/
ENV PATH=/opt/pystreams/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYSTREAMS_STATE_DIR=/var/lib/pystreams/state
# The state directory is a volume in Kubernetes; this one serves `docker run` (owned by the user).
RUN mkdir -p /var/lib/pystreams/state && chown -R 10001:10001 /var/lib/pystreams
WORKDIR /opt/pystreams
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "pystreams"]
CMD ["--help"]

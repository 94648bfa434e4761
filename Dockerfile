# syntax=docker/dockerfile:1
# Two images from one tree: `docker build --target operator .` and `docker build --target trainer .`
# Both run as the non-root user 1000 that the rendered pods demand (runAsNonRoot).

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin ddpjob
WORKDIR /opt/ddpjob
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/ trainer_image/
# The CRD ships with the code: `ddpjob crd` and `ddpjob validate` read it from the chart's crds/.
COPY charts/ddpjob-operator/crds/ charts/ddpjob-operator/crds/

FROM base AS operator
RUN pip install --no-cache-dir --editable '.[operator]'
USER 1000:1000
EXPOSE 8080 9090
ENTRYPOINT ["ddpjob"]
CMD ["operator"]

FROM base AS trainer
# torch from PyPI brings its own CUDA runtime; the node's driver is all the GPU side needs.
RUN pip install --no-cache-dir --editable '.[trainer]'
USER 1000:1000
EXPOSE 29500 9400
ENTRYPOINT ["torchrun"]
CMD ["--module", "ddp_trainer"]

# syntax=docker/dockerfile:1
# Two images from one tree: `docker build --target operator .` and `docker build --target trainer .`
# Both install the project's wheel (no checkout in the image; the CRD ships inside the package) and run
# as the non-root user 1000 that the rendered pods demand (runAsNonRoot).

FROM python:3.11-slim AS build
# pip runs as root in these build steps, on purpose (the image is the environment): no warning about it
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md MANIFEST.in ./
# the in-tree build backend (pyproject.toml: backend-path); without it no wheel builds
COPY hack/backend/ hack/backend/
COPY operator/ operator/
COPY trainer_image/ trainer_image/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin ddpjob

FROM runtime AS operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "/wheels/ddpjob-0.1.0-py3-none-any.whl[operator]"
USER 1000:1000
EXPOSE 8080 9090
ENTRYPOINT ["ddpjob"]
CMD ["operator"]

FROM runtime AS trainer
# torch from PyPI brings its own CUDA runtime; the node's driver is all the GPU side needs.
# s3: checkpoints in object storage (spec.checkpoint.s3); a small client, imported only when used.
# The extras' dependencies come first, read from pyproject.toml alone: that layer (~6 GB, torch's CUDA wheels)
# is built again only when pyproject.toml changes, not on every edit of the code, and a new build beside the
# last one adds megabytes, not another 6 GB (a full disk failed a build that way). The wheel then adds itself.
COPY pyproject.toml /tmp/ddpjob/
RUN python -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]; \
      print(*p["dependencies"], *(d for e in sys.argv[2:] for d in p["optional-dependencies"][e]), sep="\n")' \
      /tmp/ddpjob/pyproject.toml trainer s3 > /tmp/ddpjob/requirements.txt \
    && pip install --no-cache-dir -r /tmp/ddpjob/requirements.txt \
    && rm -rf /tmp/ddpjob
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "/wheels/ddpjob-0.1.0-py3-none-any.whl[trainer,s3]"
# the examples' plain torch scripts, so examples/no-code.yaml, plain-loop.yaml, hsdp.yaml and elastic-loop.yaml run as shipped
# (their args name examples/<script>.py, relative to the working directory)
WORKDIR /home/ddpjob
COPY examples/plain_ddp.py examples/plain_loop.py examples/hsdp.py examples/elastic_loop.py examples/
USER 1000:1000
EXPOSE 29500 9400
# torchrun (its elastic agent restarts the gang in place) with the bookkeeping of ddp_trainer.launch
ENTRYPOINT ["python", "-m", "ddp_trainer.launch"]
CMD ["--module", "ddp_trainer"]

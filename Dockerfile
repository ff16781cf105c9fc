# The freshkey image: `freshkey connector`, `freshkey worker`, `freshkey doctor` (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the CPU-only index: from PyPI it would pull a multi-GB CUDA build. Its own layer, so
# code changes do not reinstall it. 2.13.0 satisfies the project's torch range, so `pip install .` keeps it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /src
COPY . .
# PyMySQL[rsa] adds `cryptography`: MySQL 8 users default to caching_sha2_password, whose first login
# over a non-TLS connection needs RSA; without it PyMySQL cannot log in as the freshkey user.
RUN pip install . "PyMySQL[rsa]" \
    && python -c "import torch, pipeline.cli; print('torch', torch.__version__)"

RUN useradd --system --uid 10001 --home-dir /var/lib/freshkey --shell /usr/sbin/nologin freshkey \
    && mkdir -p /var/lib/freshkey/connector /var/lib/freshkey/worker /etc/freshkey \
    && chown -R freshkey:freshkey /var/lib/freshkey

USER freshkey
WORKDIR /var/lib/freshkey
# The worker's web port (FRESHKEY_WORKER_WEB_PORT: /freshkey/health, /freshkey/stats, /dashboard) and the
# Prometheus ports of the worker (9464) and the connector (9465). docker-compose.yml mounts
# deploy/healthcheck.py for the healthchecks (standard library only, so nothing more is installed here).
EXPOSE 6066 9464 9465

CMD ["freshkey", "--help"]

# One image for every ledgerlm role (`docker compose up` starts them; see docker-compose.yml).
# Untested here: this machine has no Docker engine.
FROM python:3.12-slim
WORKDIR /app
# torch from its CPU wheel index: the image stays ~1 GB instead of pulling CUDA libraries.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch
COPY pyproject.toml README.md ./
COPY ledgerlm ledgerlm
COPY plumbing plumbing
COPY schemas schemas
COPY producers producers
COPY consumers consumers
COPY engine engine
COPY projections projections
COPY infra infra
COPY migrations migrations
COPY bench bench
RUN pip install --no-cache-dir .
ENV LEDGERLM_HOME=/var/lib/ledgerlm
ENTRYPOINT ["ledgerlm"]

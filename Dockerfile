# The gateway image: the API (`gateway serve`) and the workers (`gateway worker`) run from it, with their engine.
#   docker build -t change-gateway .
# Behind a proxy that inspects TLS, give the build its CA bundle (used at build time only, never kept in the image):
#   docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t change-gateway .

# The build: the runtime lock (every distribution checked against its sha256) into a virtualenv, the engine, the
# gateway; nothing of it but those folders reaches the image.
FROM python:3.11-slim AS build

# The engine the workers run stacks with. terraform: the pinned, sha256-checked Terraform and providers of `make
# terraform` (tools/install_engine.sh; their licences in /opt/engine/NOTICE), and the Terraform sample's test
# provider. cloudformation: the `cloudformation` extra (boto3, cfn-lint), which the terraform image does without.
ARG ENGINE=terraform

RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.lock requirements-$ENGINE.lock ./
COPY tools tools
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi \
 && python -m venv --without-pip /opt/gateway \
 && pip --python /opt/gateway/bin/python install --no-cache-dir --require-hashes --no-deps \
      -r requirements.lock -r requirements-$ENGINE.lock \
 && PATH=/opt/gateway/bin:$PATH sh tools/install_engine.sh "$ENGINE" /opt/engine
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY agents agents
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip --python /opt/gateway/bin/python install --no-cache-dir --no-deps . \
 && find /opt/gateway -name '*.so*' -type f -exec strip --strip-debug {} +

FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 gateway && useradd --create-home --uid 10001 --gid 10001 gateway \
 && mkdir /workspace /keys && chown 10001:10001 /workspace /keys \
 && mkdir -p /usr/share/doc/gateway-engine

COPY --from=build /opt/gateway /opt/gateway
COPY --from=build /opt/engine /opt/engine
COPY --from=build /app/tools/terraform/sim_provider.py /app/tools/terraform/sim_provider.py
COPY --from=build /opt/engine/NOTICE /usr/share/doc/gateway-engine/NOTICE
RUN chown -R 10001:10001 /opt/engine/plugin-cache

# numeric, so an orchestrator can check it is not root (Kubernetes' runAsNonRoot)
USER 10001:10001
ENV PATH=/opt/gateway/bin:$PATH \
    GATEWAY_HOME=/workspace \
    GATEWAY_TERRAFORM_BIN=/opt/engine/bin/terraform \
    GATEWAY_TERRAFORM_CLI_CONFIG=/opt/engine/terraformrc \
    CHECKPOINT_DISABLE=1 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 8080 9100
CMD ["gateway", "--help"]

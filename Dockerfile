# The gateway image: the API (`gateway serve`) and the workers (`gateway worker`) run from it, with their engine.
FROM python:3.11-slim

# The engine the workers run `engine: terraform` stacks with: the pinned, sha256-checked Terraform and providers
# of `make terraform` (tools/install_engine.sh; its licences in /opt/engine/NOTICE).
ARG ENGINE=terraform

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 gateway \
 && mkdir /workspace && chown gateway /workspace

WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install --no-cache-dir -r requirements.lock
COPY tools tools
RUN sh tools/install_engine.sh "$ENGINE" /opt/engine \
 && chown -R gateway /opt/engine/plugin-cache \
 && mkdir -p /usr/share/doc/gateway-engine && cp /opt/engine/NOTICE /usr/share/doc/gateway-engine/NOTICE
COPY gateway gateway
COPY agents agents
COPY evals evals
RUN pip install --no-cache-dir --no-deps .

USER gateway
ENV GATEWAY_HOME=/workspace \
    GATEWAY_TERRAFORM_BIN=/opt/engine/bin/terraform \
    GATEWAY_TERRAFORM_CLI_CONFIG=/opt/engine/terraformrc \
    CHECKPOINT_DISABLE=1
EXPOSE 8080 9100
CMD ["gateway", "--help"]

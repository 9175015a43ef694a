# The gateway image: the API (`gateway serve`) and the workers (`gateway worker`) run from it.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 gateway \
 && mkdir /workspace && chown gateway /workspace

WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install --no-cache-dir -r requirements.lock
COPY gateway gateway
COPY agents agents
COPY prompts prompts
COPY evals evals
RUN pip install --no-cache-dir --no-deps .

USER gateway
ENV GATEWAY_HOME=/workspace
EXPOSE 8080
CMD ["gateway", "--help"]

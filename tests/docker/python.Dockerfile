# A local stand-in for python:3.11-slim (no registry is reachable from the test machines), from Debian's packages:
# CPython 3.11 with pip where the official image has them (/usr/local/bin/python, pip), pip allowed to install
# system-wide as there. Only the tests build and use it; the project's Dockerfile names the real image.
FROM gateway-test/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/bin/python3 /usr/local/bin/python && ln -s /usr/bin/pip3 /usr/local/bin/pip \
 && rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED
ENV LANG=C.UTF-8
CMD ["python3"]

# A local stand-in for postgres:16 (no registry is reachable from the test machines), from Debian's packages: Debian
# 12 ships PostgreSQL 15, which is what runs. It honours what compose.yaml uses of the official image: POSTGRES_PASSWORD,
# POSTGRES_DB, PGDATA at /var/lib/postgresql/data, and PGPORT (a test on the host's network moves it off 5432).
FROM gateway-test/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]

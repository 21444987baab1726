# pitcrew: one process serving the webhook, the API, /metrics and the engine.
FROM python:3.11-slim-bookworm

# Slurm's client commands for the scontrol backend (talks to slurmctld with munge).
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client munge \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pitcrew
COPY pyproject.toml README.md ./
COPY bot ./bot
RUN pip install --no-cache-dir . \
 && useradd --system --uid 10001 --home-dir /var/lib/pitcrew --create-home pitcrew

USER 10001
ENV XDG_STATE_HOME=/var/lib \
    PITCREW_STORE__PATH=/var/lib/pitcrew/pitcrew.db \
    PITCREW_LOG__FORMAT=json
VOLUME ["/var/lib/pitcrew"]
EXPOSE 9095
ENTRYPOINT ["pitcrew"]
CMD ["serve", "--listen", "0.0.0.0:9095"]

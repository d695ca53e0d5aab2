# Multi-stage build: the image holds only the `turnstile` binary and config/ (no demo backend).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tests ./tests
RUN cargo build --release --locked --bin turnstile

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin turnstile \
 && mkdir -p /data && chown turnstile /data
COPY --from=build /src/target/release/turnstile /usr/local/bin/turnstile
COPY config /etc/turnstile
USER turnstile
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8787/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["serve", "--config", "/etc/turnstile/turnstile.toml"]

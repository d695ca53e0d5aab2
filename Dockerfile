# Multi-stage build: the image holds the `turnstile` binary, the demo backend and config/; it
# starts as shipped on config/container.toml (the demo config with the image's paths).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tests ./tests
RUN cargo build --release --locked --bin turnstile --bin turnstile-demo-backend

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin turnstile \
 && mkdir -p /data && chown turnstile /data
COPY --from=build /src/target/release/turnstile /usr/local/bin/turnstile
COPY --from=build /src/target/release/turnstile-demo-backend /usr/local/bin/turnstile-demo-backend
COPY config /etc/turnstile
USER turnstile
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8787/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/turnstile"]
CMD ["serve", "--config", "/etc/turnstile/container.toml"]

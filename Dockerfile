# Build: the whole toolchain, librdkafka and OpenSSL compiled from source by the crates.
FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace: Cargo needs every member's manifest (plugin crate, examples).
COPY . .
RUN cargo build --release --locked --bin mirror-maker

# Run: a small image, a non-root user, nothing but the binary and CA certificates.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home mirror
COPY --from=build /src/target/release/mirror-maker /usr/local/bin/mirror-maker
USER 10001
# --metrics.addr 0.0.0.0:9464 serves /metrics, /health/live and /health/ready here.
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/mirror-maker"]
CMD ["--help"]

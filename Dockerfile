# The base images are build arguments; the defaults are what `docker build .` pulls. Pin them
# by digest for a build that does not move under you (`docker buildx imagetools inspect
# rust:1-bookworm` or `podman image inspect --format '{{.Digest}}'` gives the digest):
#   docker build --build-arg BUILD_IMAGE=rust:1-bookworm@sha256:<digest> \
#                --build-arg RUNTIME_IMAGE=debian:bookworm-slim@sha256:<digest> -t mirror-maker .
# Any bookworm-based runtime works, e.g. the one scripts/base-image makes without a registry.
# Dockerfile.prebuilt is this image's runtime stage around a binary built on the host.
ARG BUILD_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# Build: the whole toolchain, librdkafka and OpenSSL compiled from source by the crates.
FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# The whole workspace: Cargo needs every member's manifest (plugin crate, examples, tests'
# harness). .dockerignore keeps target/, .git, config/ and keys out of the context.
COPY . .
RUN cargo build --release --locked --bin mirror-maker

# Run: a small image, a non-root user, nothing but the binary and CA certificates. The
# binary links librdkafka and OpenSSL statically; it needs libc6, libgcc-s1 and zlib1g at run
# time, which every Debian base has. A base that has CA certificates already (scripts/base-image)
# needs no package lists.
FROM ${RUNTIME_IMAGE}
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && useradd --system --uid 10001 --no-create-home mirror
COPY --from=build /src/target/release/mirror-maker /usr/local/bin/mirror-maker
USER 10001
# --metrics.addr 0.0.0.0:9464 serves /metrics, /health/live and /health/ready here.
EXPOSE 9464
# Docker's health check asks /health/ready through bash's /dev/tcp (the image has no curl):
# it needs the metrics server on MIRROR_HEALTH_ADDR (set it when --metrics.addr uses another
# port). Kubernetes ignores HEALTHCHECK: give it httpGet probes on /health/live and
# /health/ready instead. Podman keeps it only in the docker image format (--format docker).
ENV MIRROR_HEALTH_ADDR=127.0.0.1:9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/${MIRROR_HEALTH_ADDR%:*}/${MIRROR_HEALTH_ADDR##*:} && printf 'GET /health/ready HTTP/1.0\\r\\n\\r\\n' >&3 && read -r _ status _ <&3 && [ \"$status\" = 200 ]"]
ENTRYPOINT ["/usr/local/bin/mirror-maker"]
CMD ["--help"]

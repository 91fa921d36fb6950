# The storage-migrator image: the operator binary and everything its copy, verify and measure
# Jobs run (a POSIX sh, rsync, GNU cp, du, stat, GNU find and sed, grep, sort, tr, head, tail, stdbuf, sync, sleep, date), CA certificates
# and a `nonroot` user.
# The operator runs as that user; it also uses this image, at the same version, as the default
# image of its Jobs (which run as root, see src/build/job.rs).
#
# A user who reaches a registry builds it with the defaults:
#     docker build -t ghcr.io/storage-migrator/storage-migrator:0.1.0 .
# buildah 1.28 (Debian 12's; podman builds with buildah) skips a stage that a FROM names only
# through an ARG's default, so with it pass the two stage-selecting arguments explicitly:
#     podman build --build-arg BINARY=build --build-arg RUNTIME_BASE=runtime-debian \
#       -t ghcr.io/storage-migrator/storage-migrator:0.1.0 .
# e2e/scripts/build-image.sh builds this same file without a registry: it passes BINARY=context
# (the operator built on the host) and RUNTIME_BASE=<a Debian root made with mmdebstrap>, so only
# the stages `binary-context` and the final one are built, and neither has a RUN.
#
# Build arguments:
#   RUST_IMAGE    image of the `binary-build` stage (Rust toolchain on Debian 12)
#   DEBIAN_IMAGE  image under the `runtime-debian` stage
#   BINARY        `build` (compile in the `binary-build` stage) or `context` (take
#                 target/release/storage-migrator from the build context)
#   RUNTIME_BASE  `runtime-debian` (the stage below) or an image with the same packages and user
#   VERSION       the operator's version, for the labels (kept equal to Cargo.toml's by a test)
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
ARG BINARY=build
ARG RUNTIME_BASE=runtime-debian

# --- the operator, compiled in a container --------------------------------------------------
FROM ${RUST_IMAGE} AS binary-build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole workspace: cargo loads every member's manifest, and --locked checks Cargo.lock.
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY e2e e2e
RUN cargo build --release --locked --bin storage-migrator \
 && install -D -m 0755 target/release/storage-migrator /out/storage-migrator

# --- the operator, built beforehand on the host (cargo build --release --locked) -------------
FROM scratch AS binary-context
COPY target/release/storage-migrator /out/storage-migrator

FROM binary-${BINARY} AS binary

# --- the runtime root: Debian 12 with the Jobs' tools and the nonroot user ------------------
# build-image.sh makes the same root with mmdebstrap (variant essential, the same --include
# list, the same user and group lines) and passes it as RUNTIME_BASE.
FROM ${DEBIAN_IMAGE} AS runtime-debian
RUN apt-get update \
 && apt-get install -y --no-install-recommends rsync ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'nonroot:x:65532:' >> /etc/group \
 && install -d -m 0755 -o 65532 -g 65532 /home/nonroot

# --- the image: no RUN, so building it needs no container runtime ---------------------------
FROM ${RUNTIME_BASE}
ARG VERSION=0.1.0
COPY --from=binary /out/storage-migrator /usr/local/bin/storage-migrator
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/storage-migrator"]
CMD ["run"]
LABEL org.opencontainers.image.title="storage-migrator" \
      org.opencontainers.image.description="Kubernetes operator that moves a StatefulSet's volumes to another StorageClass or a smaller size; also its copy Jobs' image" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/storage-migrator/storage-migrator" \
      org.opencontainers.image.licenses="Apache-2.0"

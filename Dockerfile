# Palisade image: one static binary, nothing else.
#
# Stage `offline` (first, so the legacy builder reaches it without a registry)
# packs a binary built on the host:
#   RUSTFLAGS='-C target-feature=+crt-static' \
#     cargo build --release --target x86_64-unknown-linux-gnu
#   DOCKER_BUILDKIT=0 docker build --target offline -t palisade:local .
#
# The default (last) stage builds from source in a Rust image, for machines
# that can pull from a registry:
#   docker build -t palisade:local .

FROM scratch AS offline
COPY target/x86_64-unknown-linux-gnu/release/palisade /palisade
ENTRYPOINT ["/palisade"]

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --locked --target x86_64-unknown-linux-gnu \
 && cp target/x86_64-unknown-linux-gnu/release/palisade /palisade

FROM scratch AS default
COPY --from=build /palisade /palisade
ENTRYPOINT ["/palisade"]

# syntax=docker/dockerfile:1
# idem-origin as a static, non-root, FROM-scratch image.
#   docker build -t idem-origin .
#   docker run --rm -p 8080:8080 -e IDEM_STORE=postgres -e DATABASE_URL=postgres://… idem-origin
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p idem-origin --bin idem-origin \
 && cp target/x86_64-unknown-linux-musl/release/idem-origin /idem-origin

# --- final stage: identical to ./Containerfile (scripts/container-smoke checks) ---
FROM scratch
COPY --from=build /idem-origin /idem-origin
USER 65532:65532
EXPOSE 8080
ENV IDEM_LISTEN=0.0.0.0:8080
ENTRYPOINT ["/idem-origin"]

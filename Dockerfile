# zkgate in a container, for use with an existing ZooKeeper ensemble:
#   docker build -t zkgate .
#   docker run -p 7070:7070 -e ZKGATE_ZOOKEEPER=zk1:2181,zk2:2181,zk3:2181 zkgate
# (The embedded ZooKeeper of `zkgate serve` without ZKGATE_ZOOKEEPER needs Java and ZooKeeper,
# which this small image leaves out on purpose.)

FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, so that code changes do not rebuild them.
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY benches ./benches
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY src ./src
COPY web ./web
RUN touch src/main.rs src/lib.rs && cargo build --release --locked
# The manual pages and shell completions, from the same definitions as `zkgate --help`.
RUN mkdir -p /out/man1 /out/completions \
    && target/release/zkgate man /out/man1 \
    && target/release/zkgate completions bash > /out/completions/zkgate.bash \
    && target/release/zkgate completions zsh > /out/completions/_zkgate \
    && target/release/zkgate completions fish > /out/completions/zkgate.fish

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin zkgate
COPY --from=build /src/target/release/zkgate /usr/local/bin/zkgate
COPY --from=build /out/man1/ /usr/share/man/man1/
COPY --from=build /out/completions/zkgate.bash /usr/share/bash-completion/completions/zkgate
COPY --from=build /out/completions/_zkgate /usr/share/zsh/vendor-completions/_zkgate
COPY --from=build /out/completions/zkgate.fish /usr/share/fish/vendor_completions.d/zkgate.fish
USER zkgate
ENV ZKGATE_LISTEN=0.0.0.0:7070
EXPOSE 7070
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
    CMD curl -fsS http://127.0.0.1:7070/readyz >/dev/null || exit 1
ENTRYPOINT ["zkgate"]
CMD ["serve"]

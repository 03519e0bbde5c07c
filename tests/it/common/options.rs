//! The settings of the tests' ZooKeeper servers, shared by the harness and by
//! `examples/test_zookeeper.rs` (the server a test run shares), which includes this file.

use std::time::Duration;

use zkgate::zk::server::ServerOptions;

/// Options for test servers: short ticks (so short session timeouts are allowed), no fsync,
/// quick JVM start.
pub fn test_server_options() -> ServerOptions {
    ServerOptions {
        tick_time: Duration::from_millis(200),
        data_dir: None,
        force_sync: false,
        heap_mb: 256,
        quick_start: true,
        extra_config: Vec::new(),
        // Empty containers (locks...) go within a fraction of a second: tests/it/retention.rs
        // waits for them.
        container_check_interval: Duration::from_millis(200),
        containers_per_minute: 6_000_000,
    }
}

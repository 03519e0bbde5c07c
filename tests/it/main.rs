//! zkgate's integration tests, in one binary: each module was a test binary of its own, and
//! linking some fifty of them (each with the whole harness in `common/`) cost minutes of every
//! build. nextest still runs each test in a process of its own; `common::zookeeper` hands each
//! a root of its own on the ZooKeeper server the test command shares (or a server of its own
//! when run without one), and the tests that need a server to themselves (a proxy in front,
//! server-wide figures, faults of the server) start their own with `zookeeper_own`.
//!
//! Run one module with `cargo nextest run --test it locks::`, one test by its name.

mod common;

mod abuse;
mod auth;
mod bad_input;
mod barriers;
mod checklist;
mod cli;
mod command_line;
mod consistency;
mod counters;
mod dashboard;
mod deploy;
mod elections;
mod ensemble;
mod errors;
mod faults;
mod fuzz;
mod groups;
mod guards;
mod http2;
mod idempotency;
mod instances;
mod interop;
mod invariants;
mod keepalive;
mod kv;
mod layers;
mod leases;
mod limits;
mod linearizability;
mod lock_runner;
mod locks;
mod loss;
mod metrics;
mod openapi;
mod origin;
mod outage;
mod ownership;
mod paging;
mod peers;
mod queue_runner;
mod queues;
mod quotas;
mod readme;
mod retention;
mod shutdown;
mod sse;
mod summary;
mod throttled;
mod tls;
mod txns;
mod watch_runner;
mod websocket;
mod websocket_faults;
mod websocket_leases;
mod websocket_topics;
mod zookeeper_connections;
mod zookeeper_security;

//! Nagle's algorithm off on zookeeper-client's connections.
//!
//! zookeeper-client (0.11) connects with `async_net::TcpStream` and never sets `TCP_NODELAY`.
//! With Nagle's algorithm on, a small write waits in the kernel while an earlier one is
//! unacknowledged. A contender sends its create and its getChildren back to back, and the
//! server acknowledges the create only with its reply: the pipelined pair costs two round
//! trips instead of one, and so does any request written while another is unanswered (measured
//! in BENCHMARKS.md, "`TCP_NODELAY` on the ZooKeeper connections"). ZooKeeper's own server
//! sockets already run without it.
//!
//! The crate has no hook for its socket, so after every connection (the first one of a session
//! and each reconnection) the supervisor looks through this process's open sockets and turns
//! Nagle off on the TCP ones whose peer port is a ZooKeeper server's port. That may also catch
//! another socket that happens to talk to such a port; without Nagle it only sends sooner. Where
//! `/proc/self/fd` does not exist (not Linux) nothing happens.

use std::os::fd::BorrowedFd;

/// The ports of the servers in `hosts` (`host:port[,host:port...]`, no chroot).
pub fn server_ports(hosts: &str) -> Vec<u16> {
    hosts
        .split(',')
        .filter_map(|host| host.trim().rsplit_once(':')?.1.parse().ok())
        .collect()
}

/// Turns Nagle's algorithm off on every TCP socket of this process connected to one of
/// `ports`; returns how many sockets it changed.
pub fn disable_nagle_towards(ports: &[u16]) -> usize {
    let mut changed = 0;
    for_each_socket_towards(ports, |socket| {
        if socket.set_tcp_nodelay(true).is_ok() {
            changed += 1;
        }
    });
    changed
}

/// How many TCP sockets of this process are connected to one of `ports`, and whether Nagle's
/// algorithm is off on all of them (for tests).
pub fn nodelay_towards(ports: &[u16]) -> (usize, bool) {
    let (mut count, mut all) = (0, true);
    for_each_socket_towards(ports, |socket| {
        count += 1;
        all &= socket.tcp_nodelay().unwrap_or(false);
    });
    (count, all)
}

fn for_each_socket_towards(ports: &[u16], mut each: impl FnMut(&socket2::SockRef<'_>)) {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in fds.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: `fd` was open when listed and is used for a few socket calls right away. If
        // another thread closes it in between, the calls fail with EBADF, or reach whatever
        // reused the number: a peer-port check (and at worst `TCP_NODELAY`) on another socket
        // of this process, which is harmless.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&fd);
        let towards = socket
            .peer_addr()
            .ok()
            .and_then(|peer| peer.as_socket())
            .is_some_and(|peer| ports.contains(&peer.port()));
        if towards && socket.r#type().is_ok_and(|t| t == socket2::Type::STREAM) {
            each(&socket);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_come_from_the_connect_string() {
        assert_eq!(super::server_ports("a:2181, b:2182,[::1]:2183"), vec![2181, 2182, 2183]);
        assert_eq!(super::server_ports("no-port"), Vec::<u16>::new());
    }
}

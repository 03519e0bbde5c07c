//! What a socket has yet to send, bounded in bytes: per socket, and over all the sockets of the
//! instance.
//!
//! A client that stops reading must not make zkgate hold what it will not read. Counting
//! messages did not bound that: a subscription to a large value queues a large message per
//! change. So a message holds its size in two budgets (the socket's and the instance's) from
//! the moment it is queued until it has been written to the socket. An event that finds no
//! room is dropped for this socket (its subscription then sends a `resync` with the state when
//! there is room again); a reply waits for room. A message larger than the socket's whole
//! budget is let through alone, when nothing else is queued, so that it can still be sent.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};

/// A message and its hold on the budgets (the socket's and the instance's) until it is written.
pub struct Queued {
    pub text: String,
    _held: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// The sending side (cloned by the socket's subscriptions and calls).
#[derive(Clone)]
pub struct Outbox {
    queue: mpsc::UnboundedSender<Queued>,
    socket: Arc<Semaphore>,
    socket_bytes: usize,
    instance: Arc<Semaphore>,
}

/// The budget of all the sockets of an instance.
#[derive(Clone)]
pub struct Budget {
    bytes: usize,
    semaphore: Arc<Semaphore>,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let bytes = bytes.clamp(1, Semaphore::MAX_PERMITS);
        Budget {
            bytes,
            semaphore: Arc::new(Semaphore::new(bytes)),
        }
    }

    /// Bytes queued over all the sockets now.
    pub fn queued(&self) -> usize {
        self.bytes - self.semaphore.available_permits()
    }
}

/// A socket's outbox of `bytes`, drawing on `instance` too, and its receiving end.
pub fn outbox(bytes: usize, instance: &Budget) -> (Outbox, mpsc::UnboundedReceiver<Queued>) {
    let (queue, receive) = mpsc::unbounded_channel();
    let bytes = bytes.clamp(1, Semaphore::MAX_PERMITS);
    let outbox = Outbox {
        queue,
        socket: Arc::new(Semaphore::new(bytes)),
        socket_bytes: bytes,
        instance: instance.semaphore.clone(),
    };
    (outbox, receive)
}

/// Why a message was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No room now (an event is dropped; its subscription resyncs later).
    Full,
    /// The socket is gone.
    Closed,
}

impl Outbox {
    /// What a message of `bytes` holds of the budgets: its size, at most the socket's whole budget.
    fn cost(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.clamp(1, self.socket_bytes)).unwrap_or(u32::MAX)
    }

    /// Queues `text` if there is room now.
    pub fn try_send(&self, text: String) -> Result<(), Refused> {
        let cost = self.cost(text.len());
        let socket = self.socket.clone().try_acquire_many_owned(cost).map_err(refused)?;
        let instance = self.instance.clone().try_acquire_many_owned(cost).map_err(refused)?;
        self.push(text, socket, instance)
    }

    /// Queues `text`, waiting for room.
    pub async fn send(&self, text: String) -> Result<(), Refused> {
        let cost = self.cost(text.len());
        let acquire = |budget: &Arc<Semaphore>| budget.clone().acquire_many_owned(cost);
        let socket = acquire(&self.socket).await.map_err(|_| Refused::Closed)?;
        let instance = acquire(&self.instance).await.map_err(|_| Refused::Closed)?;
        self.push(text, socket, instance)
    }

    /// Waits until a message of `bytes` would fit (for a subscription to resync when there is
    /// room again).
    pub async fn room_for(&self, bytes: usize) -> Result<(), Refused> {
        let _socket = self
            .socket
            .acquire_many(self.cost(bytes))
            .await
            .map_err(|_| Refused::Closed)?;
        Ok(())
    }

    fn push(&self, text: String, socket: OwnedSemaphorePermit, instance: OwnedSemaphorePermit) -> Result<(), Refused> {
        let queued = Queued {
            text,
            _held: (socket, instance),
        };
        self.queue.send(queued).map_err(|_| Refused::Closed)
    }

    /// Bytes queued on this socket now.
    pub fn queued(&self) -> usize {
        self.socket_bytes - self.socket.available_permits()
    }
}

fn refused(err: TryAcquireError) -> Refused {
    match err {
        TryAcquireError::NoPermits => Refused::Full,
        TryAcquireError::Closed => Refused::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_hold_their_bytes_until_written() {
        let instance = Budget::new(1000);
        let (outbox, mut receive) = outbox(100, &instance);
        outbox.try_send("x".repeat(60)).expect("room");
        assert_eq!(
            outbox.try_send("y".repeat(60)),
            Err(Refused::Full),
            "past the socket's budget"
        );
        assert_eq!(outbox.queued(), 60);
        assert_eq!(instance.queued(), 60);
        let first = receive.recv().await.expect("queued");
        assert_eq!(first.text.len(), 60);
        drop(first);
        assert_eq!(outbox.queued(), 0, "written: the bytes are free again");
        // A message larger than the whole budget goes alone.
        outbox.try_send("z".repeat(500)).expect("alone");
        assert_eq!(outbox.try_send("a".into()), Err(Refused::Full));
    }

    #[tokio::test]
    async fn the_instance_budget_is_shared() {
        let instance = Budget::new(100);
        let (a, _keep_a) = outbox(80, &instance);
        let (b, _keep_b) = outbox(80, &instance);
        a.try_send("x".repeat(80)).expect("room");
        assert_eq!(
            b.try_send("y".repeat(30)),
            Err(Refused::Full),
            "the instance's budget is spent"
        );
        b.try_send("y".repeat(20)).expect("what is left");
    }
}

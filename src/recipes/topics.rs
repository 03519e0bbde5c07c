//! Each kind's resource as its topic ([crate::recipes::topic::Source]): the one place a
//! resource's name becomes what its `GET` reads and its event stream follows (the socket, `GET
//! /v1/events` and its own `GET .../events` alike). Apart from `topic.rs`, which every recipe
//! names for the trait, so that nothing comes back round.

/// Each kind's resource as its topic: what its `GET` reads and its event stream follows.
impl crate::recipes::Recipes {
    pub fn lock_topic(&self, name: &str) -> crate::recipes::locks::exclusive::LockTopic {
        crate::recipes::locks::exclusive::LockTopic {
            name: name.to_string(),
            dir: self.locks.dir(name),
            local: self.locks.clone(),
            why_ended: self.leases.why_ended(),
        }
    }

    pub fn rwlock_topic(&self, name: &str) -> crate::recipes::locks::rwlock::RwLockTopic {
        crate::recipes::locks::rwlock::RwLockTopic {
            name: name.to_string(),
            dir: self.rwlocks.dir(name),
            local: self.rwlocks.clone(),
        }
    }

    pub fn semaphore_topic(&self, name: &str) -> crate::recipes::locks::semaphore::SemaphoreTopic {
        crate::recipes::locks::semaphore::SemaphoreTopic {
            name: name.to_string(),
            dir: self.semaphores.dir(name),
            local: self.semaphores.clone(),
        }
    }

    pub fn election_topic(&self, name: &str) -> crate::recipes::elections::Leadership {
        crate::recipes::elections::Leadership {
            name: name.to_string(),
            dir: self.elections.dir(name),
            local: self.elections.clone(),
        }
    }

    pub fn barrier_topic(&self, name: &str) -> crate::recipes::barriers::barrier::BarrierTopic {
        crate::recipes::barriers::barrier::BarrierTopic {
            name: name.to_string(),
            path: self.barriers.dir(name),
        }
    }

    pub fn double_barrier_topic(&self, name: &str) -> crate::recipes::barriers::double::DoubleBarrierTopic {
        crate::recipes::barriers::double::DoubleBarrierTopic {
            name: name.to_string(),
            dir: self.double_barriers.dir(name),
        }
    }

    pub fn queue_topic(&self, name: &str) -> crate::recipes::queues::topic::QueueTopic {
        crate::recipes::queues::topic::QueueTopic {
            name: name.to_string(),
            paths: self.queues.paths(name),
        }
    }

    pub fn counter_topic(&self, name: &str) -> crate::recipes::counters::CounterTopic {
        crate::recipes::counters::CounterTopic {
            name: name.to_string(),
            path: crate::kind::Kind::Counter.path(&self.root, name),
        }
    }

    pub fn group_topic(&self, name: &str) -> crate::recipes::groups::group::GroupTopic {
        crate::recipes::groups::group::GroupTopic {
            name: name.to_string(),
            dir: self.groups.dir(name),
        }
    }

    pub fn service_topic(&self, name: &str) -> crate::recipes::groups::service::ServiceTopic {
        crate::recipes::groups::service::ServiceTopic {
            name: name.to_string(),
            dir: self.services.dir(name),
        }
    }

    pub fn txn_topic(&self, id: &str) -> crate::recipes::txns::TxnTopic {
        crate::recipes::txns::TxnTopic {
            id: id.to_string(),
            dir: self.txn_members.dir(id),
        }
    }
}

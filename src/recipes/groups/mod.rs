//! The group family: group membership (lease-bound members with data) and service discovery
//! (lease-bound instances, picked round robin or at random).

pub mod group;
pub mod service;

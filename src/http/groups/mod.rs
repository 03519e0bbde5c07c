//! The group family over HTTP: group membership and service discovery, one file each.

pub mod group;
pub mod service;

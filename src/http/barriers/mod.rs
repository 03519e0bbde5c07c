//! The barrier family over HTTP: barriers and double barriers, one file each.

pub mod barrier;
pub mod double;

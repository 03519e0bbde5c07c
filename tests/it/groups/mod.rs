//! The group family, as `src/recipes/groups/` has it: group membership and service discovery.

mod group;
mod service;

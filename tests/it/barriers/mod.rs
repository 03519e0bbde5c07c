//! The barrier family, as `src/recipes/barriers/` has it: barriers and double barriers.

mod barrier;
mod double;

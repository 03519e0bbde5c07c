//! The barrier family: a barrier (raised, lowered, waited on until down) and a double barrier
//! (entered together, left together).

pub mod barrier;
pub mod double;

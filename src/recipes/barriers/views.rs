//! The barrier family's words as the API says them: a raise's body, the waits' queries, a
//! double barrier's enter and leave and where a participant stands after one.

use serde::{Deserialize, Serialize};

use crate::recipes::leases::LeaseView;
use crate::time::HumanDuration;

/// Body of a raise (optional): without it the barrier is persistent.
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RaiseBody {
    /// Bind the barrier to this lease: it falls when the lease ends.
    pub lease: Option<String>,
    /// Bind the barrier to a new lease with this TTL.
    pub ttl: Option<HumanDuration>,
}

/// Query of a wait.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DownQuery {
    /// How long to wait for the barrier to be down (capped by the server's maximum, which is
    /// also the default).
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Query of an enter or a leave.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PassageQuery {
    /// How long to wait (capped by the server's maximum, which is also the default). When it
    /// ends first, the answer is 202 and the call can be repeated to go on waiting.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Body of an enter.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnterBody {
    /// The participant's id, unique in the barrier.
    #[schema(example = "worker-3")]
    pub participant: String,
    /// How many participants make the barrier open (the first enter records it).
    #[schema(example = 5, minimum = 1)]
    #[serde(deserialize_with = "whole_u32")]
    pub size: u32,
    /// The lease the participant lives by. Without it a new lease is created.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// Body of a leave.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaveBody {
    #[schema(example = "worker-3")]
    pub participant: String,
}

/// Where a participant stands after an enter or a leave.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Passage {
    #[schema(example = "batch-7")]
    pub barrier: String,
    pub participant: String,
    /// `true` when the participant went through (all entered, or all left).
    pub passed: bool,
    /// Participants inside now.
    pub inside: usize,
    /// The lease of the participant, after an enter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
}

/// A count that JSON may write as `5` or `5.0` (both are the integer 5 to JSON Schema, and a
/// client that computed it as a float sends the second): a whole number from 0 to `u32::MAX`.
pub fn whole_u32<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let number = <serde_json::Number as serde::Deserialize>::deserialize(deserializer)?;
    let whole = number.as_u64().or_else(|| {
        number
            .as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f))
            .map(|f| f as u64)
    });
    whole
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("must be a whole number from 0 to {}, not {number}", u32::MAX)))
}

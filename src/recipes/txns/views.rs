//! Two-phase commit's words as the API says them: a creation's body, a read's query, a
//! registration's and a vote's bodies.

use std::time::Duration;

use serde::Deserialize;

use super::Vote;
use crate::time::HumanDuration;

/// Longest a transaction may wait for its votes.
pub const MAX_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Most participants a transaction may have.
pub const MAX_PARTICIPANTS: usize = 100;

/// Body of `POST /v1/txns`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTxn {
    /// The transaction's id (default: a new UUID).
    pub id: Option<String>,
    /// Who must vote (1 to 100 distinct names).
    #[schema(example = json!(["billing", "inventory"]), min_items = 1, max_items = 100)]
    pub participants: Vec<String>,
    /// What is being decided, shown to everyone.
    #[schema(example = json!({"order": 42}))]
    pub payload: Option<serde_json::Value>,
    /// How long the participants have to vote (at most 24h); then the transaction aborts
    /// (default 60s).
    pub deadline: Option<HumanDuration>,
}

/// Query of a transaction read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TxnQuery {
    /// Wait (up to this long, capped by the server's maximum) for the decision.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Body of a registration (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    /// The lease the registration lives by (without it a new lease is created): if it ends
    /// before the participant votes, the transaction aborts.
    pub lease: Option<String>,
    pub ttl: Option<HumanDuration>,
}

/// Body of a vote.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoteBody {
    pub vote: Vote,
}

//! Two-phase commit: the operations a client asks for (create, read and wait for the decision,
//! register, vote), on the protocol of [txn].

use std::collections::BTreeSet;
use std::time::Duration;

use crate::auth::Caller;
use crate::kind::Kind;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::node;
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::topic::Source;
use crate::recipes::{Recipes, check_name, validate_name};
use crate::time::at_most;
use crate::zk::{Failure, Session};

pub mod txn;
mod views;

pub use txn::*;
pub use views::{CreateTxn, MAX_DEADLINE, MAX_PARTICIPANTS, RegisterBody, TxnQuery, VoteBody};

/// Creates the transaction `body` describes (409 `txn-exists` if its id is taken); this
/// instance coordinates it (it alone watches the votes).
pub async fn create(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    body: CreateTxn,
) -> Result<TxnState, ApiError> {
    let id = body.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    validate_name(&id).map_err(|e| ApiError::invalid(Place::Body, "id", e))?;
    caller.require(crate::kind::Kind::Txn.auth(), &id, crate::auth::Access::Write)?;
    if body.participants.is_empty() || body.participants.len() > MAX_PARTICIPANTS {
        let detail = format!("must name 1 to {MAX_PARTICIPANTS} participants");
        return Err(ApiError::invalid(Place::Body, "participants", detail));
    }
    let mut seen = BTreeSet::new();
    for participant in &body.participants {
        validate_name(participant)
            .map_err(|e| ApiError::invalid(Place::Body, "participants", format!("`{participant}` {e}")))?;
        if !seen.insert(participant) {
            let detail = format!("`{participant}` is named twice");
            return Err(ApiError::invalid(Place::Body, "participants", detail));
        }
    }
    let deadline = body.deadline.map(|d| d.0).unwrap_or(Duration::from_secs(60));
    if deadline.is_zero() {
        return Err(ApiError::invalid(Place::Body, "deadline", "must be above zero"));
    }
    at_most(deadline, MAX_DEADLINE).map_err(|e| ApiError::invalid(Place::Body, "deadline", e))?;
    let now = crate::time::now_ms();
    let spec = Spec {
        participants: body.participants,
        payload: body.payload,
        deadline_ms: crate::time::ms_after_now(deadline),
        created_at_ms: now,
    };
    let stored = serde_json::to_vec(&spec).map_or(0, |s| s.len());
    recipes.check_stored_size("transaction (with its payload)", stored)?;
    let id = id.as_str();
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.zk().connected().await?;
    let dir = recipes.txn_members.dir(id);
    let created = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        txn::create(&session, &dir, &spec, guards).await
    );
    created.map_err(|err| match err {
        Failure::Taken => ApiError::new(Problem::TxnExists, format!("a transaction `{id}` exists")),
        err => err.into(),
    })?;
    tokio::spawn(txn::coordinate(recipes.zk().clone(), dir.clone(), spec.deadline_ms));
    read_on(recipes, &session, id).await
}

/// Transaction `id`, after waiting (up to `wait`, capped) for its decision. Past the deadline
/// the reader writes the abort itself if nobody has, so a lost coordinator cannot leave a
/// transaction undecided.
pub async fn read(
    recipes: &Recipes,
    id: &str,
    wait: Option<Duration>,
    consistency: Consistency,
) -> Result<TxnState, ApiError> {
    check_name(id)?;
    let session = recipes.reader(consistency).await?;
    let dir = recipes.txn_members.dir(id);
    let Some(record) = txn::read(&session, &dir).await? else {
        return Err(not_found(id));
    };
    if let Some(wait) = wait.filter(|_| record.decision.is_none()) {
        let until = crate::time::instant_after(recipes.wait(Some(wait)));
        crate::admission::park();
        txn::await_decision(&session, &recipes.barrier_watches, &dir, record.spec.deadline_ms, until).await?;
    }
    read_on(recipes, &session, id).await
}

/// Registers `participant` of transaction `id`: its own node, bound to `lease` (or a new one
/// with `ttl`), so that its failure before it votes aborts the transaction.
pub async fn register(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (id, participant): (&str, &str),
    RegisterBody { lease, ttl }: RegisterBody,
) -> Result<TxnState, ApiError> {
    let ttl = ttl.map(|t| t.0);
    let (_, dir, _) = participant_of(recipes, caller, id, participant).await?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let (lease, _) = recipes.leases.for_request(caller, lease, ttl).await?;
    // The member node lives on the lease's session, and is read back on it (which sees it).
    let session = lease.session().await?;
    let path = txn::member_path(&dir, participant);
    let (nodes, data) = (&recipes.txn_members, node::owner_record(&lease));
    let hold = crate::recipes::nodes::hold(recipes, guards, nodes, &lease, (id, participant), path, (data, None));
    if recipes.leases.held(&lease, hold.await?)?.is_none() {
        let detail = format!("`{participant}` is registered by another");
        return Err(ApiError::new(Problem::MemberTaken, detail));
    }
    read_on(recipes, &session, id).await
}

/// `participant` of transaction `id` votes. A vote is final: the same vote again is accepted,
/// another is refused; so is a vote once the transaction is decided.
pub async fn vote(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (id, participant): (&str, &str),
    vote: Vote,
) -> Result<TxnState, ApiError> {
    let (session, dir, record) = participant_of(recipes, caller, id, participant).await?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    if let Some(decision) = &record.decision
        && record.votes.get(participant) != Some(&vote)
    {
        return Err(
            ApiError::new(Problem::TxnDecided, format!("`{id}` was decided: {}", decision.reason))
                .with("outcome", decision.outcome),
        );
    }
    if !record.registered.contains(participant) && !record.votes.contains_key(participant) {
        let detail = format!("`{participant}` must register (PUT .../participants/{participant}) before it votes");
        return Err(ApiError::new(Problem::NotRegistered, detail));
    }
    let voted = retry_guarded!(
        guards,
        recipes,
        Err(VoteError::ZooKeeper(Failure::Unguarded)),
        txn::record_vote(&session, &dir, (participant, vote), guards).await
    );
    voted.map_err(|err| match err {
        VoteError::AlreadyVoted(existing) => ApiError::new(
            Problem::AlreadyVoted,
            format!("`{participant}` voted {existing:?}; a vote is final"),
        )
        .with("vote", existing),
        VoteError::ZooKeeper(err) => err.into(),
    })?;
    read_on(recipes, &session, id).await
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found("transaction", format!("no transaction `{id}`"))
}

/// Transaction `id` read on `session`, 404 if there is none.
async fn read_on(recipes: &Recipes, session: &Session, id: &str) -> Result<TxnState, ApiError> {
    let read = recipes.txn_topic(id).read(session).await?;
    if read.exists { Ok(read) } else { Err(not_found(id)) }
}

/// The transaction, checking that `participant` is one of it (and, registered here, the
/// caller's).
async fn participant_of(
    recipes: &Recipes,
    caller: &Caller,
    id: &str,
    participant: &str,
) -> Result<(Session, String, Record), ApiError> {
    check_name(id)?;
    validate_name(participant).map_err(|e| ApiError::invalid(Place::Path, "participant", e))?;
    let session = recipes.synced().await?;
    let dir = recipes.txn_members.dir(id);
    // A participant registered with another principal's lease is not the caller's, whichever
    // instance it registered through: its node records the principal.
    let member = txn::member_path(&dir, participant);
    let what = format!("participant `{participant}`");
    node::check_owner(&session, &recipes.root, Kind::Txn, &member, caller, &what).await?;
    let record = txn::read(&session, &dir).await?.ok_or_else(|| not_found(id))?;
    if !record.spec.participants.iter().any(|p| p == participant) {
        let detail = format!("`{participant}` is not a participant of `{id}`");
        return Err(ApiError::new(Problem::NotAParticipant, detail));
    }
    Ok((session, dir, record))
}

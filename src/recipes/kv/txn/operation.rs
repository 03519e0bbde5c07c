//! Transactions' operation: what `POST /v1/kv-txn` asks, committed as [run] commits it, its
//! refusals mapped to problems. (Its own file: the protocol in `mod.rs` is long already.)

use std::collections::HashMap;
use std::sync::Arc;

use super::{ATTEMPTS, BindingRefusal, Bindings, Outcome, Step, Txn, TxnError, key_name, run};
use crate::auth::Caller;
use crate::problem::{ApiError, Problem};
use crate::recipes::Recipes;
use crate::recipes::engine::lease::Lease;
use crate::recipes::guards::{Guard, Guards, retry_guarded, standing};
use crate::recipes::idempotency::{Key, Keyed};
use crate::recipes::usage::Payer;
use crate::zk::Failure;

/// Commits `txn` for `caller` (`Idempotency-Key` `key`: at most once for it): the leases its
/// puts name served first, the branch its compares choose run in one multi-op.
pub async fn commit(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    txn: &Txn,
    key: Option<&Key>,
) -> Result<Outcome, ApiError> {
    let mut leases = HashMap::new();
    for step in txn.then.iter().chain(&txn.otherwise) {
        if let Step::Put { lease: Some(id), .. } = step
            && !leases.contains_key(id)
        {
            leases.insert(id.clone(), recipes.leases.serve(caller, id).await?);
        }
    }
    let session = recipes.zk().connected().await?;
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: caller.name(),
    };
    let bound = Bindings {
        keys: &recipes.kv_keys,
        leases: &leases,
        quotas: &recipes.quotas,
        caller,
    };
    let keyed = key.map(|key| Keyed {
        keys: &recipes.idempotency,
        key,
    });
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let mut outcome = Err(TxnError::Contended);
    for attempt in 0..ATTEMPTS {
        // The compares of guards, resolved again (from ZooKeeper) after one changed.
        let mut held = Vec::new();
        for (index, guard) in txn.held() {
            held.push((index, standing(recipes, caller, guard, attempt > 0).await?));
        }
        outcome = retry_guarded!(
            guards,
            recipes,
            Err(TxnError::ZooKeeper(Failure::Unguarded)),
            run(
                &session,
                txn,
                recipes.max_value_bytes,
                payer,
                bound,
                (keyed, guards, &held)
            )
            .await
        );
        if !matches!(outcome, Err(TxnError::HeldChanged)) {
            break;
        }
    }
    let outcome = outcome.map_err(|err| txn_error(recipes, &leases, err))?;
    if !outcome.repeated {
        let label = if outcome.failed_compare.is_none() {
            "then"
        } else {
            "else"
        };
        crate::metrics::get().kv_transactions.with_label_values(&[label]).inc();
    }
    Ok(outcome)
}

fn key_of(recipes: &Recipes, path: &str) -> String {
    key_name(&recipes.root, path).to_string()
}

fn txn_error(recipes: &Recipes, leases: &HashMap<String, Arc<Lease>>, err: TxnError) -> ApiError {
    match err {
        TxnError::Binding(BindingRefusal::Bound { path, lease }) => {
            let key = key_of(recipes, &path);
            let detail = format!("`{key}` is bound to lease `{lease}`: a transaction's put must name that lease");
            ApiError::new(Problem::KeyBound, detail).with("lease", lease)
        }
        TxnError::Binding(BindingRefusal::NotYours { path, lease, principal }) => ApiError::new(
            Problem::Forbidden,
            format!(
                "`{}` is bound to lease `{lease}` of principal `{principal}`: only that principal (or an admin) deletes it",
                key_of(recipes, &path)
            ),
        ),
        TxnError::Binding(BindingRefusal::NotBound { path }) => ApiError::new(
            Problem::KeyNotBound,
            format!(
                "`{}` exists bound to no lease: a transaction does not bind it",
                key_of(recipes, &path)
            ),
        ),
        TxnError::Key(err) => err.into(),
        TxnError::LeaseEnded(id) => match leases.get(&id) {
            Some(lease) => recipes.leases.gone(lease),
            None => ApiError::new(Problem::LeaseEnded, format!("lease `{id}` ended")),
        },
        TxnError::HeldChanged | TxnError::Contended => crate::limits::refusal(
            format!(
                "the keys (or the holders) it compares kept changing: tried {} times",
                ATTEMPTS
            ),
            std::time::Duration::from_secs(1),
        )
        .into(),
        TxnError::NotEmpty(path) => ApiError::new(
            Problem::KeyNotEmpty,
            format!("`{}` has keys below it", key_of(recipes, &path)),
        ),
        TxnError::OutcomeUnknown => ApiError::new(
            Problem::OutcomeUnknown,
            "ZooKeeper's connection was lost after the transaction was sent: read its keys before trying again",
        ),
        TxnError::Quota(exceeded) => ApiError::from(exceeded),
        TxnError::ZooKeeper(err) => err.into(),
    }
}

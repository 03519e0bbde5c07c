//! A multi-op whose operations carry a tag of the caller's choosing: what each one was for.
//!
//! ZooKeeper answers a refused multi-op with the index of the operation that failed, and a
//! committed one with a result per operation, in order. Decoding those by index means keeping
//! a second list in step with the writer (and shifting it when an optional operation is left
//! out); here the builder keeps it, so a refusal comes back as the tag of the operation that
//! was refused and a result is found by its tag. Helpers that add operations for a caller (a
//! lease's guard, a charge's refund) take the builder and the tag to give them.

use std::future::Future;

use zookeeper_client::{Client, CreateOptions, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter, Stat};

/// The most deletes of one multi-op that cleans up (the janitor's, the keeper nodes'): small
/// enough that one request stays far below ZooKeeper's `jute.maxbuffer`, and others are not
/// held up behind it.
pub const DELETE_BATCH: usize = 200;

/// Operations to apply together, all or none, each tagged with a `T`.
pub struct Multi<'c, T> {
    writer: MultiWriter<'c>,
    tags: Vec<T>,
}

/// Why a multi-op applied nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Failed<T> {
    /// ZooKeeper refused the operation tagged `tag` (with `error`), so none of them applied.
    Refused { tag: T, error: ZkError },
    /// The request failed as a whole: after a connection loss ([Failed::is_loss]) it may have
    /// applied, whole; otherwise (the session's end, a closed client) it did not.
    Request(ZkError),
}

/// What a committed multi-op answered, by tag.
#[derive(Debug)]
pub struct Done<T> {
    results: Vec<(T, MultiWriteResult)>,
}

impl<'c, T> Multi<'c, T> {
    pub fn new(client: &'c Client) -> Self {
        Multi {
            writer: client.new_multi_writer(),
            tags: Vec::new(),
        }
    }

    /// Checks that `path` is at `version` (the multi-op fails otherwise).
    pub fn check(&mut self, tag: T, path: &str, version: i32) -> Result<(), ZkError> {
        self.writer.add_check_version(path, version)?;
        self.tags.push(tag);
        Ok(())
    }

    pub fn create(&mut self, tag: T, path: &str, data: &[u8], options: &CreateOptions<'_>) -> Result<(), ZkError> {
        self.writer.add_create(path, data, options)?;
        self.tags.push(tag);
        Ok(())
    }

    /// Sets `path`'s data, if it is at `version` (any version: `None`).
    pub fn set(&mut self, tag: T, path: &str, data: &[u8], version: Option<i32>) -> Result<(), ZkError> {
        self.writer.add_set_data(path, data, version)?;
        self.tags.push(tag);
        Ok(())
    }

    /// Deletes `path`, if it is at `version` (any version: `None`).
    pub fn delete(&mut self, tag: T, path: &str, version: Option<i32>) -> Result<(), ZkError> {
        self.writer.add_delete(path, version)?;
        self.tags.push(tag);
        Ok(())
    }

    /// How many operations are added.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Sends the operations (now: requests sent after this call on the same session are
    /// served after it) and leaves the builder empty for the next attempt. An empty multi-op
    /// sends nothing and is done.
    pub fn commit(&mut self) -> impl Future<Output = Result<Done<T>, Failed<T>>> + Send + 'c
    where
        T: Send + 'c,
    {
        let tags = std::mem::take(&mut self.tags);
        let sent = self.writer.commit();
        async move {
            match sent.await {
                Ok(results) => Ok(Done {
                    results: tags.into_iter().zip(results).collect(),
                }),
                Err(MultiWriteError::RequestFailed { source }) => Err(Failed::Request(source)),
                Err(MultiWriteError::OperationFailed { index, source }) => match tags.into_iter().nth(index) {
                    Some(tag) => Err(Failed::Refused { tag, error: source }),
                    // A server that names an operation it was not sent.
                    None => Err(Failed::Request(ZkError::UnexpectedError(format!(
                        "multi-op refused at operation {index}: {source}"
                    )))),
                },
            }
        }
    }
}

impl<T> Failed<T> {
    /// Whether the reply was lost: the multi-op may have applied, whole.
    pub fn is_loss(&self) -> bool {
        matches!(self, Failed::Request(error) if super::is_loss(error))
    }

    /// ZooKeeper's error, whichever operation it came from.
    pub fn error(self) -> ZkError {
        match self {
            Failed::Refused { error, .. } | Failed::Request(error) => error,
        }
    }
}

impl<T> From<Failed<T>> for super::Failure {
    fn from(failed: Failed<T>) -> super::Failure {
        failed.error().into()
    }
}

impl<T: PartialEq> Done<T> {
    /// The path made by the (first) create tagged `tag`: a sequential node's full name.
    pub fn created(&self, tag: &T) -> Option<&str> {
        match self.find(|t| t == tag)? {
            MultiWriteResult::Create { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The stat left by the (first) create or set tagged `tag`; `None` also where the server
    /// left it out of the reply (a create's, ZOOKEEPER-4026: read the node instead).
    pub fn stat(&self, tag: &T) -> Option<&Stat> {
        self.stat_where(|t| t == tag)
    }
}

impl<T> Done<T> {
    fn find(&self, is: impl Fn(&T) -> bool) -> Option<&MultiWriteResult> {
        self.results.iter().find(|(t, _)| is(t)).map(|(_, result)| result)
    }

    /// The stat left by the (first) set tagged `tag` (not a create's with the same tag).
    pub fn set_stat(&self, tag: &T) -> Option<&Stat>
    where
        T: PartialEq,
    {
        self.results.iter().find_map(|(t, result)| match result {
            MultiWriteResult::SetData { stat } if t == tag => Some(stat),
            _ => None,
        })
    }

    /// [Done::stat] of the first operation whose tag `is` picks.
    pub fn stat_where(&self, is: impl Fn(&T) -> bool) -> Option<&Stat> {
        match self.find(is)? {
            MultiWriteResult::Create { stat, .. } | MultiWriteResult::SetData { stat } if !stat.is_invalid() => {
                Some(stat)
            }
            _ => None,
        }
    }

    /// The same answer with its tags mapped; results whose tag maps to `None` are left out.
    pub fn filter_map<U>(self, mut f: impl FnMut(T) -> Option<U>) -> Done<U> {
        Done {
            results: self
                .results
                .into_iter()
                .filter_map(|(tag, result)| f(tag).map(|tag| (tag, result)))
                .collect(),
        }
    }
}

//! Verb results. The variants carry the result names of `spec/RULES.md` ("Conventions"), so a
//! test can assert the exact result a rule asks for.

use crate::attr::AttrMask;

/// The error result of a verb call. Success is `Ok`; an empty CQ is not an error in the Rust
/// API (`poll` returns 0), so `CqEmpty` has no variant here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    #[error("insufficient resources")]
    InsufficientResources,
    #[error("invalid HCA handle (device closed or another device)")]
    InvalidHcaHandle,
    #[error("invalid QP handle")]
    InvalidQpHandle,
    #[error("invalid CQ handle")]
    InvalidCqHandle,
    #[error("invalid protection domain")]
    InvalidPd,
    #[error("invalid MR handle")]
    InvalidMrHandle,
    #[error("invalid address handle")]
    InvalidAhHandle,
    #[error("invalid service type: {0}")]
    InvalidServiceType(&'static str),
    #[error("invalid reliable datagram domain")]
    InvalidRdd,
    #[error("maximum number of work requests exceeded")]
    MaxWrExceeded,
    #[error("maximum number of scatter/gather entries exceeded")]
    MaxSgeExceeded,
    #[error("invalid QP state for this verb")]
    InvalidQpState,
    #[error("invalid QP state transition")]
    InvalidTransition,
    #[error("missing required attribute(s): {0:?}")]
    MissingAttribute(AttrMask),
    #[error("invalid attribute(s) {0:?}: {1}")]
    InvalidAttribute(AttrMask, &'static str),
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    #[error("work queue full")]
    QueueFull,
    #[error("work request type not valid for this QP's service type")]
    InvalidWrType,
    #[error("invalid work request: {0}")]
    InvalidWr(&'static str),
    #[error("CQ size larger than the HCA supports")]
    CqSizeTooLarge,
    #[error("invalid CQ size: {0}")]
    InvalidCqSize(&'static str),
    #[error("CQ still associated with a work queue")]
    CqInUse,
    #[error("resource still in use: {0}")]
    InUse(&'static str),
    #[error("invalid access flags: {0}")]
    InvalidAccess(&'static str),
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

/// The result of a verb.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// A rejected Post Send or Post Receive: nothing of the list was queued, and `index` names the
/// first work request that failed (the `bad_wr` of libibverbs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work request {index}: {error}")]
pub struct PostError {
    pub index: usize,
    pub error: VerbsError,
}

impl From<PostError> for VerbsError {
    fn from(e: PostError) -> Self {
        e.error
    }
}

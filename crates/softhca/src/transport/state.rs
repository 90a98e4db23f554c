//! The QP state machine as data (DESIGN rule 3): which Modify QP transitions software may
//! command (QPT), and which attributes each (from, to, service type) requires and accepts
//! (MOD). [`check_modify`] is a pure function of those tables, so it can be tested
//! exhaustively.

use crate::error::{Result, VerbsError};
use crate::types::{AttrMask, QpState, QpType};

use QpState as S;

/// QPT matrix: may software command `from` → `to`? SQE is never a target (QPT-INV-2); RC
/// never reaches SQE, so its row does not matter for RC.
pub fn transition_allowed(from: QpState, to: QpState) -> bool {
    if to == S::Reset || to == S::Error {
        return true; // QPT-SW-7, QPT-SW-8, QPT-SW-9
    }
    matches!(
        (from, to),
        (S::Reset, S::Init)
            | (S::Init, S::Init)
            | (S::Init, S::Rtr)
            | (S::Rtr, S::Rts)
            | (S::Rts, S::Rts)
            | (S::Rts, S::Sqd)
            | (S::Sqd, S::Rts)
            | (S::Sqd, S::Sqd)
            | (S::Sqe, S::Rts)
    )
}

/// Required and optional parameters of one transition for one service type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrRule {
    pub required: AttrMask,
    pub optional: AttrMask,
}

const fn r(required: AttrMask, optional: AttrMask) -> AttrRule {
    AttrRule { required, optional }
}

const NONE: AttrMask = AttrMask::empty();
const ENABLES: AttrMask = AttrMask::READ_EN.union(AttrMask::WRITE_EN).union(AttrMask::ATOMIC_EN);

/// Columns RC, UC, UD, RD, in the order of [`QpType::TABLE`]; XRC's QPs take RC's column
/// less what their side lacks ([`xrc_lacks`]).
type Row = [AttrRule; 4];

/// What an XRC QP's side lacks of RC's attributes. The digest has no XRC: its columns are
/// RC's less these, as the kernel's `qp_state_table` has them for `IB_QPT_XRC_INI` and
/// `IB_QPT_XRC_TGT` (and as uverbs' `modify_qp_mask` strips them): an initiator takes no
/// responder attribute; a target no requester attribute beyond the Local ACK Timeout and the
/// SQ PSN, and no queue size (it has no queue). An initiator resizes its send queue where RC
/// may (its receive queue stays empty: `Qp::recv_wr`). Like RC, neither reaches SQE.
fn xrc_lacks(qp_type: QpType) -> AttrMask {
    match qp_type {
        QpType::XrcSend => AttrMask::MAX_DEST_RD_ATOMIC.union(AttrMask::MIN_RNR_TIMER),
        QpType::XrcRecv => {
            AttrMask::RETRY_CNT.union(AttrMask::RNR_RETRY).union(AttrMask::MAX_RD_ATOMIC).union(AttrMask::CAP)
        }
        _ => NONE,
    }
}

const RESET_INIT: Row = [
    r(ENABLES.union(AttrMask::PKEY_INDEX).union(AttrMask::PORT), NONE),
    r(AttrMask::WRITE_EN.union(AttrMask::PKEY_INDEX).union(AttrMask::PORT), NONE),
    r(AttrMask::PKEY_INDEX.union(AttrMask::QKEY).union(AttrMask::PORT), NONE),
    r(ENABLES.union(AttrMask::QKEY), NONE),
];

const INIT_RTR: Row = [
    r(
        AttrMask::RQ_PSN.union(AttrMask::MAX_DEST_RD_ATOMIC).union(AttrMask::AV).union(AttrMask::DEST_QPN),
        AttrMask::ALT_PATH
            .union(ENABLES)
            .union(AttrMask::PKEY_INDEX)
            .union(AttrMask::CAP)
            .union(AttrMask::MIN_RNR_TIMER),
    ),
    r(
        AttrMask::RQ_PSN.union(AttrMask::AV).union(AttrMask::DEST_QPN),
        AttrMask::ALT_PATH.union(AttrMask::WRITE_EN).union(AttrMask::PKEY_INDEX).union(AttrMask::CAP),
    ),
    r(NONE, AttrMask::PKEY_INDEX.union(AttrMask::QKEY).union(AttrMask::CAP)),
    r(AttrMask::MAX_DEST_RD_ATOMIC, ENABLES.union(AttrMask::QKEY).union(AttrMask::CAP).union(AttrMask::MIN_RNR_TIMER)),
];

const RTR_RTS: Row = [
    r(
        AttrMask::TIMEOUT
            .union(AttrMask::SQ_PSN)
            .union(AttrMask::RETRY_CNT)
            .union(AttrMask::RNR_RETRY)
            .union(AttrMask::MAX_RD_ATOMIC),
        ENABLES
            .union(AttrMask::ALT_PATH)
            .union(AttrMask::PATH_MIG_STATE)
            .union(AttrMask::CAP)
            .union(AttrMask::MIN_RNR_TIMER),
    ),
    r(
        AttrMask::SQ_PSN,
        AttrMask::WRITE_EN.union(AttrMask::ALT_PATH).union(AttrMask::PATH_MIG_STATE).union(AttrMask::CAP),
    ),
    r(AttrMask::SQ_PSN, AttrMask::QKEY.union(AttrMask::CAP)),
    r(
        AttrMask::MAX_RD_ATOMIC,
        ENABLES
            .union(AttrMask::QKEY)
            .union(AttrMask::PATH_MIG_STATE)
            .union(AttrMask::CAP)
            .union(AttrMask::MIN_RNR_TIMER),
    ),
];

const RTS_SQD: Row = [r(NONE, AttrMask::SQD_EVENT); 4];

/// SQD → RTS, and SQD → SQD ("the SQD → RTS set").
const SQD_RTS: Row = [
    r(
        NONE,
        AttrMask::AV
            .union(AttrMask::ALT_PATH)
            .union(AttrMask::PATH_MIG_STATE)
            .union(AttrMask::MAX_RD_ATOMIC)
            .union(AttrMask::MAX_DEST_RD_ATOMIC)
            .union(AttrMask::PKEY_INDEX)
            .union(AttrMask::TIMEOUT)
            .union(AttrMask::RETRY_CNT)
            .union(AttrMask::RNR_RETRY)
            .union(AttrMask::CAP)
            .union(AttrMask::MIN_RNR_TIMER)
            .union(AttrMask::PORT)
            .union(ENABLES),
    ),
    r(
        NONE,
        AttrMask::AV
            .union(AttrMask::ALT_PATH)
            .union(AttrMask::PATH_MIG_STATE)
            .union(AttrMask::PKEY_INDEX)
            .union(AttrMask::CAP)
            .union(AttrMask::WRITE_EN),
    ),
    r(NONE, AttrMask::QKEY.union(AttrMask::PKEY_INDEX).union(AttrMask::CAP)),
    r(
        NONE,
        AttrMask::PATH_MIG_STATE
            .union(AttrMask::MAX_RD_ATOMIC)
            .union(AttrMask::MAX_DEST_RD_ATOMIC)
            .union(AttrMask::QKEY)
            .union(AttrMask::CAP)
            .union(AttrMask::MIN_RNR_TIMER)
            .union(ENABLES),
    ),
];

const SQE_RTS: Row = [
    r(NONE, NONE), // RC never reaches SQE (QPS-SQE-1).
    r(NONE, AttrMask::WRITE_EN),
    r(NONE, AttrMask::QKEY),
    r(NONE, ENABLES.union(AttrMask::QKEY)),
];

const INIT_INIT: Row = [
    r(NONE, AttrMask::PKEY_INDEX.union(AttrMask::PORT).union(ENABLES)),
    r(NONE, AttrMask::PKEY_INDEX.union(AttrMask::PORT).union(AttrMask::WRITE_EN)),
    r(NONE, AttrMask::PKEY_INDEX.union(AttrMask::PORT).union(AttrMask::QKEY)),
    r(NONE, ENABLES.union(AttrMask::QKEY)),
];

const RTS_RTS: Row = [
    r(NONE, ENABLES.union(AttrMask::ALT_PATH).union(AttrMask::PATH_MIG_STATE).union(AttrMask::MIN_RNR_TIMER)),
    r(NONE, AttrMask::WRITE_EN.union(AttrMask::ALT_PATH).union(AttrMask::PATH_MIG_STATE)),
    r(NONE, AttrMask::QKEY),
    r(NONE, ENABLES.union(AttrMask::PATH_MIG_STATE).union(AttrMask::MIN_RNR_TIMER).union(AttrMask::QKEY)),
];

/// A Raw QP takes only the port at Reset→Init and nothing elsewhere (MOD-RAW-1).
const RAW_RESET_INIT: AttrRule = r(AttrMask::PORT, NONE);

/// The attribute rule of a transition the QPT matrix allows; `None` for a rejected pair.
pub fn attr_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<AttrRule> {
    if !transition_allowed(from, to) {
        return None;
    }
    if qp_type.is_raw() {
        return Some(if (from, to) == (S::Reset, S::Init) { RAW_RESET_INIT } else { r(NONE, NONE) });
    }
    let row: &Row = match (from, to) {
        (_, S::Reset) | (_, S::Error) => return Some(r(NONE, NONE)), // MOD-GEN-12
        (S::Reset, S::Init) => &RESET_INIT,
        (S::Init, S::Init) => &INIT_INIT,
        (S::Init, S::Rtr) => &INIT_RTR,
        (S::Rtr, S::Rts) => &RTR_RTS,
        (S::Rts, S::Rts) => &RTS_RTS,
        (S::Rts, S::Sqd) => &RTS_SQD,
        (S::Sqd, S::Rts) | (S::Sqd, S::Sqd) => &SQD_RTS,
        (S::Sqe, S::Rts) => &SQE_RTS,
        _ => return None,
    };
    let base = if qp_type.is_xrc() { QpType::Rc } else { qp_type };
    let col = QpType::TABLE.iter().position(|t| *t == base)?;
    let lacks = xrc_lacks(qp_type);
    Some(r(row[col].required - lacks, row[col].optional - lacks))
}

/// Checks a Modify QP request against the tables: the transition (QPT-INV-*), then missing
/// required attributes (MOD-GEN-3), then attributes the transition does not take (MOD-GEN-4,
/// MOD-GEN-12). Values are checked by the caller.
pub fn check_modify(qp_type: QpType, from: QpState, to: QpState, supplied: AttrMask) -> Result<()> {
    // An RC QP never reaches SQE, so SQE→RTS does not exist for it.
    if qp_type.is_reliable_connected() && from == S::Sqe {
        return Err(VerbsError::InvalidTransition);
    }
    let rule = attr_rule(qp_type, from, to).ok_or(VerbsError::InvalidTransition)?;
    let missing = rule.required - supplied;
    if !missing.is_empty() {
        return Err(VerbsError::MissingAttribute(missing));
    }
    let extra = supplied - (rule.required | rule.optional);
    if !extra.is_empty() {
        return Err(VerbsError::InvalidAttribute(extra, "not accepted by this transition"));
    }
    Ok(())
}
